//! Thin wrappers over the driver's stream-ordered allocator (memory pools).

use std::sync::OnceLock;

use crate::raw;
use cudarc::driver::sys;

use crate::capabilities::AllocationHandleType;
use crate::context::{context_api, ensure_current_context};
use crate::device::DeviceId;
use crate::driver::resolve;
use crate::entry::{RawMemLocation, RawPoolProps};
use crate::error::{check, CudaResult};
use crate::memory::MemLocation;
use crate::ptr::DevicePtr;
use crate::version::DriverVersion;

/// A memory pool handle (`CUmemoryPool`), kept as an address so it is `Send + Sync`.
///
/// Plain data: it does not own the pool or keep it alive, and a copy outlives the pool it
/// names. So every function that hands it to the driver is `unsafe` and asks for a **live**
/// pool: one created by [`mem_pool_create`] and not yet passed to [`mem_pool_destroy`], a
/// device's default pool ([`device_default_mem_pool`], [`default_managed_mem_pool`]: the driver
/// never destroys those), or a pool whose owner keeps it alive for the duration of the call.
/// Safe code gets a live pool from a type that owns or shares it, such as rmm-mr's
/// `CudaAsyncMemoryResource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemPoolHandle(usize);

impl MemPoolHandle {
    /// Wraps a raw `CUmemoryPool`.
    #[must_use]
    pub fn from_raw(pool: raw::CUmemoryPool) -> Self {
        Self(pool as usize)
    }

    /// The raw `CUmemoryPool`.
    #[must_use]
    pub fn as_raw(self) -> raw::CUmemoryPool {
        self.0 as raw::CUmemoryPool
    }

    /// Whether this is the null handle.
    #[must_use]
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_ALLOCATION_TYPE_MANAGED` (CUDA 13).
const ALLOCATION_TYPE_MANAGED: u32 = 2;

/// What a new pool's memory may serve beyond ordinary device work (`CUmemPoolProps::usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemPoolUsage {
    /// Ordinary device memory (`usage` 0).
    #[default]
    Default,
    /// `CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS` (CUDA 12.8): the pool's memory may be a buffer of
    /// the hardware decompression engine, as `cuMemAlloc`'s memory always may be.
    HwDecompress,
}

impl MemPoolUsage {
    /// RMM's choice for the pool of its `cuda_async_memory_resource`: [`HwDecompress`] where the
    /// driver knows the flag (CUDA 12.8 and later), [`Default`] before.
    ///
    /// [`HwDecompress`]: Self::HwDecompress
    /// [`Default`]: Self::Default
    #[must_use]
    pub fn rmm_default(driver: DriverVersion) -> Self {
        if driver >= DriverVersion::CUDA_12_8 {
            Self::HwDecompress
        } else {
            Self::Default
        }
    }

    /// The `usage` bits, and the CUDA version that introduced them.
    const fn bits(self) -> (u16, DriverVersion) {
        match self {
            Self::Default => (0, DriverVersion::MINIMUM),
            Self::HwDecompress => (0x2, DriverVersion::CUDA_12_8),
        }
    }
}

/// `cuMemPoolCreate`: a new pool of pinned device memory on `device` for ordinary use
/// ([`MemPoolUsage::Default`]; see [`mem_pool_create_with_usage`]). The caller owns it: it
/// stays live until passed to [`mem_pool_destroy`], which nothing does for it.
pub fn mem_pool_create(
    device: DeviceId,
    handle_type: AllocationHandleType,
) -> CudaResult<MemPoolHandle> {
    mem_pool_create_with_usage(device, handle_type, MemPoolUsage::Default)
}

/// [`mem_pool_create`] with the pool's `usage`. A usage the driver is too old for is an error
/// naming the CUDA version it needs (the field was reserved before it), not a driver call.
pub fn mem_pool_create_with_usage(
    device: DeviceId,
    handle_type: AllocationHandleType,
    usage: MemPoolUsage,
) -> CudaResult<MemPoolHandle> {
    let api = context_api()?;
    let (usage_bits, required) = usage.bits();
    let found = crate::driver::driver_version()?;
    if found < required {
        return Err(crate::CudaError::EntryPointUnavailable {
            symbol: "CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS",
            required,
            found,
        });
    }
    let props = RawPoolProps {
        alloc_type: ALLOCATION_TYPE_PINNED,
        handle_types: handle_type as u32,
        location: MemLocation::Device(device.0).into(),
        win32_security_attributes: std::ptr::null_mut(),
        max_size: 0,
        usage: usage_bits,
        reserved: [0; 54],
    };
    let mut pool: raw::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `RawPoolProps` has the ABI of `CUmemPoolProps` (size asserted above, fields in
    // header order); the call reads it and writes one handle.
    check("cuMemPoolCreate", unsafe {
        (api.cuMemPoolCreate)(&mut pool, &props)
    })?;
    Ok(MemPoolHandle::from_raw(pool))
}

/// `cuMemPoolDestroy`. Memory still allocated from the pool is released once freed.
///
/// # Safety
/// `pool` came from [`mem_pool_create`] and is not used afterwards.
pub unsafe fn mem_pool_destroy(pool: MemPoolHandle) -> CudaResult<()> {
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuMemPoolDestroy", unsafe {
        (api.cuMemPoolDestroy)(pool.as_raw())
    })
}

/// The pool attributes RMM reads or sets (`CUmemPool_attribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemPoolAttribute {
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (u64).
    ReleaseThreshold,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (u64).
    ReservedMemCurrent,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` (u64; set to 0 to reset).
    ReservedMemHigh,
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (u64).
    UsedMemCurrent,
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` (u64; set to 0 to reset).
    UsedMemHigh,
}

impl MemPoolAttribute {
    fn raw(self) -> sys::CUmemPool_attribute {
        use sys::CUmemPool_attribute as A;
        match self {
            Self::ReleaseThreshold => A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            Self::ReservedMemCurrent => A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            Self::ReservedMemHigh => A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            Self::UsedMemCurrent => A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            Self::UsedMemHigh => A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        }
    }
}

/// `cuMemPoolGetAttribute` for a 64-bit attribute.
///
/// # Safety
/// `pool` is a live pool (see [`MemPoolHandle`]): it was not destroyed, and is not destroyed
/// while this call runs. The handle of a destroyed pool may be dangling, or stand for another
/// pool, in the driver.
///
/// Safe code cannot pass any handle it likes:
///
/// ```compile_fail,E0133
/// use rmm_sys::{mempool, MemPoolAttribute, MemPoolHandle};
/// let dangling = MemPoolHandle::from_raw(8 as rmm_sys::raw::CUmemoryPool);
/// let _ = mempool::mem_pool_get_attribute(dangling, MemPoolAttribute::UsedMemCurrent);
/// ```
pub unsafe fn mem_pool_get_attribute(
    pool: MemPoolHandle,
    attr: MemPoolAttribute,
) -> CudaResult<u64> {
    let api = context_api()?;
    let mut v: u64 = 0;
    // SAFETY: the pool is live (caller); every attribute of `MemPoolAttribute` is a
    // cuuint64_t, which the call writes.
    check("cuMemPoolGetAttribute", unsafe {
        (api.cuMemPoolGetAttribute)(pool.as_raw(), attr.raw(), (&mut v as *mut u64).cast())
    })?;
    Ok(v)
}

/// `cuMemPoolSetAttribute` for a 64-bit attribute.
///
/// # Safety
/// As [`mem_pool_get_attribute`]: `pool` is a live pool.
///
/// ```compile_fail,E0133
/// use rmm_sys::{mempool, MemPoolAttribute, MemPoolHandle};
/// let dangling = MemPoolHandle::from_raw(8 as rmm_sys::raw::CUmemoryPool);
/// let _ = mempool::mem_pool_set_attribute(dangling, MemPoolAttribute::ReleaseThreshold, 0);
/// ```
pub unsafe fn mem_pool_set_attribute(
    pool: MemPoolHandle,
    attr: MemPoolAttribute,
    value: u64,
) -> CudaResult<()> {
    let api = context_api()?;
    let mut v = value;
    // SAFETY: as `mem_pool_get_attribute`; the driver only reads the value.
    check("cuMemPoolSetAttribute", unsafe {
        (api.cuMemPoolSetAttribute)(pool.as_raw(), attr.raw(), (&mut v as *mut u64).cast())
    })
}

/// `cuMemPoolTrimTo`: releases unused pool memory down to `min_bytes_to_keep`.
///
/// # Safety
/// As [`mem_pool_get_attribute`]: `pool` is a live pool.
///
/// ```compile_fail,E0133
/// use rmm_sys::{mempool, MemPoolHandle};
/// let dangling = MemPoolHandle::from_raw(8 as rmm_sys::raw::CUmemoryPool);
/// let _ = mempool::mem_pool_trim_to(dangling, 0);
/// ```
pub unsafe fn mem_pool_trim_to(pool: MemPoolHandle, min_bytes_to_keep: usize) -> CudaResult<()> {
    let api = context_api()?;
    // SAFETY: the pool is live (caller).
    check("cuMemPoolTrimTo", unsafe {
        (api.cuMemPoolTrimTo)(pool.as_raw(), min_bytes_to_keep)
    })
}

/// `cuMemAllocFromPoolAsync`.
///
/// # Safety
/// `stream` is a valid stream handle; `pool` a live pool.
pub unsafe fn mem_alloc_from_pool_async(
    bytes: usize,
    pool: MemPoolHandle,
    stream: raw::CUstream,
) -> CudaResult<DevicePtr> {
    fault_point!(
        Allocate, "cuMemAllocFromPoolAsync", stream
        => Err(crate::fault::unsimulated("cuMemAllocFromPoolAsync"))
    );
    let api = context_api()?;
    let mut p: raw::CUdeviceptr = 0;
    // SAFETY: the caller's contract; writes one address.
    check("cuMemAllocFromPoolAsync", unsafe {
        (api.cuMemAllocFromPoolAsync)(&mut p, bytes, pool.as_raw(), stream)
    })?;
    Ok(DevicePtr::from_raw(p))
}

/// `cuMemAllocAsync`: from the device's current pool.
///
/// # Safety
/// `stream` is a valid stream handle.
pub unsafe fn mem_alloc_async(bytes: usize, stream: raw::CUstream) -> CudaResult<DevicePtr> {
    fault_point!(
        Allocate, "cuMemAllocAsync", stream
        => Err(crate::fault::unsimulated("cuMemAllocAsync"))
    );
    let api = context_api()?;
    let mut p: raw::CUdeviceptr = 0;
    // SAFETY: the caller's contract; writes one address.
    check("cuMemAllocAsync", unsafe {
        (api.cuMemAllocAsync)(&mut p, bytes, stream)
    })?;
    Ok(DevicePtr::from_raw(p))
}

/// `cuMemFreeAsync`.
///
/// # Safety
/// `ptr` came from a stream-ordered allocation, was not freed, and work that uses it is
/// ordered before this point of `stream`.
pub unsafe fn mem_free_async(ptr: DevicePtr, stream: raw::CUstream) -> CudaResult<()> {
    fault_point!(Free, "cuMemFreeAsync", stream => Ok(()));
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuMemFreeAsync", unsafe {
        (api.cuMemFreeAsync)(ptr.addr(), stream)
    })
}

/// `cuDeviceGetDefaultMemPool`: the device's default pool (release threshold 0 unless changed).
/// The driver never destroys a default pool (`cuMemPoolDestroy` refuses one), so the handle is
/// live for the process.
pub fn device_default_mem_pool(device: DeviceId) -> CudaResult<MemPoolHandle> {
    let api = crate::driver::api()?;
    let mut pool: raw::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the driver is initialized; writes one handle.
    check("cuDeviceGetDefaultMemPool", unsafe {
        (api.cuDeviceGetDefaultMemPool)(&mut pool, device.0)
    })?;
    Ok(MemPoolHandle::from_raw(pool))
}

/// `cuDeviceGetMemPool`: the device's current pool (what `cuMemAllocAsync` allocates from,
/// and so what cudarc, candle and cubecl use).
///
/// The device's default pool unless other code made its own pool current with
/// `cuDeviceSetMemPool`; that code may destroy its pool later (the default one becomes current
/// again), so the handle is live only as long as that owner keeps it: compare it with
/// [`device_default_mem_pool`] to know.
pub fn device_current_mem_pool(device: DeviceId) -> CudaResult<MemPoolHandle> {
    let api = crate::driver::api()?;
    let mut pool: raw::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the driver is initialized; writes one handle.
    check("cuDeviceGetMemPool", unsafe {
        (api.cuDeviceGetMemPool)(&mut pool, device.0)
    })?;
    Ok(MemPoolHandle::from_raw(pool))
}

type GetDefaultMemPool =
    unsafe extern "C" fn(*mut raw::CUmemoryPool, *mut RawMemLocation, u32) -> u32;

/// `cuMemGetDefaultMemPool` (CUDA 13.0): the default **managed** pool of `device` (never
/// destroyed, so live for the process). An error naming CUDA 13.0 on older drivers.
pub fn default_managed_mem_pool(device: DeviceId) -> CudaResult<MemPoolHandle> {
    ensure_current_context()?;
    static F: OnceLock<CudaResult<GetDefaultMemPool>> = OnceLock::new();
    let f = F
        .get_or_init(|| {
            // SAFETY: `GetDefaultMemPool` is the 13.0 ABI of `cuMemGetDefaultMemPool`.
            unsafe {
                resolve(
                    "cuMemGetDefaultMemPool",
                    c"cuMemGetDefaultMemPool",
                    DriverVersion::CUDA_13_0,
                )
            }
        })
        .clone()?;
    let mut pool: raw::CUmemoryPool = std::ptr::null_mut();
    let mut location: RawMemLocation = MemLocation::Device(device.0).into();
    // SAFETY: a context is current; the call reads the location and writes one handle.
    check("cuMemGetDefaultMemPool", unsafe {
        f(&mut pool, &mut location, ALLOCATION_TYPE_MANAGED)
    })?;
    Ok(MemPoolHandle::from_raw(pool))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RMM sets the hardware-decompression usage from CUDA 12.8 on (`hwdecompress::is_supported`:
    /// driver >= 12080), and the bits are the header's.
    #[test]
    fn pool_usage_follows_rmm() {
        assert_eq!(
            MemPoolUsage::rmm_default(DriverVersion(12000)),
            MemPoolUsage::Default
        );
        assert_eq!(
            MemPoolUsage::rmm_default(DriverVersion(12070)),
            MemPoolUsage::Default
        );
        assert_eq!(
            MemPoolUsage::rmm_default(DriverVersion(12080)),
            MemPoolUsage::HwDecompress
        );
        assert_eq!(
            MemPoolUsage::rmm_default(DriverVersion(13000)),
            MemPoolUsage::HwDecompress
        );
        assert_eq!(MemPoolUsage::Default.bits(), (0, DriverVersion::MINIMUM));
        // `CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS` is 0x2 in `cuda.h` from 12.8 on (cudarc
        // names it only in its 12.8+ bindings).
        assert_eq!(
            MemPoolUsage::HwDecompress.bits(),
            (0x2, DriverVersion::CUDA_12_8)
        );
    }
}
