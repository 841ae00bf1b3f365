//! Thin wrappers over the driver's memory calls. Each makes sure the calling thread has a
//! context, converts the `CUresult` (read as an integer), and nothing else: no policy lives
//! here.
//!
//! Functions that free memory or write through an address are `unsafe`: the caller vouches that
//! the address came from the matching allocation call and that no pending work still uses it.

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::raw;
use cudarc::driver::sys;

use crate::context::{context_api, ensure_current_context};
use crate::driver::resolve;
use crate::entry::RawMemLocation;
use crate::error::{check, CudaResult, ResultCode};
use crate::ptr::DevicePtr;
use crate::version::DriverVersion;

/// `CU_MEM_ATTACH_GLOBAL`: managed memory accessible from any stream.
const CU_MEM_ATTACH_GLOBAL: u32 = 0x1;

/// `cuMemAlloc`: `bytes` of device memory on the current device (synchronous).
pub fn mem_alloc(bytes: usize) -> CudaResult<DevicePtr> {
    fault_point!(Allocate, "cuMemAlloc");
    let api = context_api()?;
    let mut p: raw::CUdeviceptr = 0;
    // SAFETY: a context is current; the call writes one address.
    check("cuMemAlloc", unsafe { (api.cuMemAlloc_v2)(&mut p, bytes) })?;
    Ok(DevicePtr::from_raw(p))
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`] or [`mem_alloc_managed`], was not freed, and no pending
/// device work uses it.
pub unsafe fn mem_free(ptr: DevicePtr) -> CudaResult<()> {
    fault_point!(Free, "cuMemFree");
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuMemFree", unsafe { (api.cuMemFree_v2)(ptr.addr()) })
}

/// `cuMemAllocManaged(.., CU_MEM_ATTACH_GLOBAL)`: managed (unified) memory.
pub fn mem_alloc_managed(bytes: usize) -> CudaResult<DevicePtr> {
    fault_point!(Allocate, "cuMemAllocManaged");
    let api = context_api()?;
    let mut p: raw::CUdeviceptr = 0;
    // SAFETY: a context is current; the call writes one address.
    check("cuMemAllocManaged", unsafe {
        (api.cuMemAllocManaged)(&mut p, bytes, CU_MEM_ATTACH_GLOBAL)
    })?;
    Ok(DevicePtr::from_raw(p))
}

/// `cuMemHostAlloc(.., 0)`: page-locked host memory, accessible from the device.
pub fn mem_host_alloc(bytes: usize) -> CudaResult<DevicePtr> {
    fault_point!(Allocate, "cuMemHostAlloc");
    let api = context_api()?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: a context is current; the call writes one host pointer.
    check("cuMemHostAlloc", unsafe {
        (api.cuMemHostAlloc)(&mut p, bytes, 0)
    })?;
    Ok(DevicePtr::from_host_ptr(p))
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`mem_host_alloc`], was not freed, and no pending work uses it.
pub unsafe fn mem_free_host(ptr: DevicePtr) -> CudaResult<()> {
    fault_point!(Free, "cuMemFreeHost");
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuMemFreeHost", unsafe {
        (api.cuMemFreeHost)(ptr.as_host_ptr())
    })
}

/// `cuMemsetD32Async`: writes `count` 32-bit words of `value` at `ptr` on `stream`.
///
/// # Safety
/// `[ptr, ptr + 4 * count)` is memory the caller may write on `stream`; `stream` is a valid
/// stream handle.
pub unsafe fn memset_d32_async(
    ptr: DevicePtr,
    value: u32,
    count: usize,
    stream: raw::CUstream,
) -> CudaResult<()> {
    fault_point!(Copy, "cuMemsetD32Async", stream => Ok(()));
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuMemsetD32Async", unsafe {
        (api.cuMemsetD32Async)(ptr.addr(), value, count, stream)
    })
}

/// `cuMemsetD8Async`: writes `count` bytes of `value` at `ptr` on `stream`.
///
/// # Safety
/// As [`memset_d32_async`], for `count` bytes.
pub unsafe fn memset_d8_async(
    ptr: DevicePtr,
    value: u8,
    count: usize,
    stream: raw::CUstream,
) -> CudaResult<()> {
    fault_point!(Copy, "cuMemsetD8Async", stream => Ok(()));
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuMemsetD8Async", unsafe {
        (api.cuMemsetD8Async)(ptr.addr(), value, count, stream)
    })
}

/// `cuMemcpyAsync`: copies `bytes` from `src` to `dst` on `stream`, the direction inferred from
/// the addresses (unified addressing: device, managed, pinned or pageable host memory).
///
/// # Safety
/// Both ranges are valid for `bytes` for the duration of the copy on `stream`; `dst` may be
/// written. A pageable host range must stay alive until the stream reaches the copy.
pub unsafe fn memcpy_async(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: raw::CUstream,
) -> CudaResult<()> {
    fault_point!(Copy, "cuMemcpyAsync", stream => Ok(()));
    let api = context_api()?;
    // SAFETY: the caller's contract.
    check("cuMemcpyAsync", unsafe {
        (api.cuMemcpyAsync)(dst.addr(), src.addr(), bytes, stream)
    })
}

/// Copies a host slice to device memory on `stream` and waits for the copy to finish.
///
/// # Safety
/// `dst` is valid for `src.len()` bytes and may be written on `stream`, a live or special
/// stream handle.
pub unsafe fn copy_to_device_sync(
    dst: DevicePtr,
    src: &[u8],
    stream: raw::CUstream,
) -> CudaResult<()> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller's contract for `dst`; `src` lives until the synchronize below.
    unsafe {
        memcpy_async(
            dst,
            DevicePtr::from_host_ptr(src.as_ptr().cast_mut()),
            src.len(),
            stream,
        )?;
    }
    // SAFETY: `stream` is valid (caller).
    unsafe { crate::stream::stream_synchronize(stream) }
}

/// Copies device memory into a host slice on `stream` and waits for the copy to finish.
///
/// # Safety
/// `src` is valid for `dst.len()` bytes and readable on `stream`, a live or special stream
/// handle.
pub unsafe fn copy_to_host_sync(
    dst: &mut [u8],
    src: DevicePtr,
    stream: raw::CUstream,
) -> CudaResult<()> {
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller's contract for `src`; `dst` lives until the synchronize below.
    unsafe {
        memcpy_async(
            DevicePtr::from_host_ptr(dst.as_mut_ptr()),
            src,
            dst.len(),
            stream,
        )?;
    }
    // SAFETY: `stream` is valid (caller).
    unsafe { crate::stream::stream_synchronize(stream) }
}

/// Whether `ptr` is managed memory (`CU_POINTER_ATTRIBUTE_IS_MANAGED`). Addresses the driver
/// does not know (system memory) are not managed.
pub fn pointer_is_managed(ptr: DevicePtr) -> CudaResult<bool> {
    let api = context_api()?;
    let mut v: u32 = 0;
    // SAFETY: a context is current; the attribute is written as an unsigned int.
    let r = unsafe {
        (api.cuPointerGetAttribute)(
            (&mut v as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr.addr(),
        )
    };
    if r == ResultCode::INVALID_VALUE.0 {
        return Ok(false);
    }
    check("cuPointerGetAttribute", r)?;
    Ok(v != 0)
}

/// `CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE` (CUDA 12.8).
const POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: u32 = 21;

/// `cuPointerGetAttribute` with the attribute as an integer (so that one newer than the
/// bindings cudarc picked can be asked for).
type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, u32, raw::CUdeviceptr) -> u32;

/// Whether the memory at `ptr` may be a buffer of the hardware decompression engine
/// (`CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE`): `cuMemAlloc`'s memory, and a pool's whose
/// usage says so ([`MemPoolUsage::HwDecompress`](crate::MemPoolUsage::HwDecompress)). An error
/// naming CUDA 12.8 on older drivers.
pub fn pointer_is_hw_decompress_capable(ptr: DevicePtr) -> CudaResult<bool> {
    ensure_current_context()?;
    static F: OnceLock<CudaResult<PointerGetAttribute>> = OnceLock::new();
    let f = F
        .get_or_init(|| {
            // SAFETY: `PointerGetAttribute` is the ABI of `cuPointerGetAttribute` (its attribute
            // is a C enum, passed as an unsigned int).
            unsafe {
                resolve(
                    "cuPointerGetAttribute",
                    c"cuPointerGetAttribute",
                    DriverVersion::CUDA_12_8,
                )
            }
        })
        .clone()?;
    // Zeroed and wider than the attribute (a boolean the driver may write as one byte or four).
    let mut v: u64 = 0;
    // SAFETY: a context is current; the call writes at most 8 bytes.
    let r = unsafe {
        f(
            (&mut v as *mut u64).cast(),
            POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE,
            ptr.addr(),
        )
    };
    check("cuPointerGetAttribute", r)?;
    Ok(v != 0)
}

/// `cuMemRangeGetAttribute(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION)`: where the managed
/// range `[ptr, ptr + bytes)` was last prefetched to, as the driver says it: a device ordinal,
/// `-1` (`CU_DEVICE_CPU`) for the host, `-2` (`CU_DEVICE_INVALID`) when it was never prefetched
/// or its pages were last prefetched to different places. Memory that is not managed is the
/// driver's error.
pub fn mem_range_last_prefetch_location(ptr: DevicePtr, bytes: usize) -> CudaResult<i32> {
    let api = context_api()?;
    let mut location: i32 = 0;
    // SAFETY: a context is current; the driver checks the range and writes one 4-byte value.
    check("cuMemRangeGetAttribute", unsafe {
        (api.cuMemRangeGetAttribute)(
            (&mut location as *mut i32).cast::<c_void>(),
            std::mem::size_of::<i32>(),
            sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
            ptr.addr(),
            bytes,
        )
    })?;
    Ok(location)
}

/// Where memory is prefetched to or preferred at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemLocation {
    /// A device.
    Device(i32),
    /// The host.
    Host,
}

impl From<MemLocation> for RawMemLocation {
    fn from(l: MemLocation) -> Self {
        match l {
            // CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_LOCATION_TYPE_HOST = 2.
            MemLocation::Device(id) => Self { kind: 1, id },
            MemLocation::Host => Self { kind: 2, id: 0 },
        }
    }
}

/// `CU_DEVICE_CPU`: the legacy (pre-13.0) ABI's way to name the host.
const CU_DEVICE_CPU: i32 = -1;

type PrefetchV2 =
    unsafe extern "C" fn(raw::CUdeviceptr, usize, RawMemLocation, u32, raw::CUstream) -> u32;
type PrefetchV1 = unsafe extern "C" fn(raw::CUdeviceptr, usize, i32, raw::CUstream) -> u32;
type AdviseV1 = unsafe extern "C" fn(raw::CUdeviceptr, usize, u32, i32) -> u32;

/// `cuMemPrefetchAsync`: migrates managed memory to `location` on `stream`. Uses CUDA 13's ABI
/// (`cuMemPrefetchAsync_v2` with a `CUmemLocation`) where the driver has it, the legacy one on
/// 12.x drivers. The caller decides what to do with `CUDA_ERROR_INVALID_VALUE` (memory that is
/// not managed).
///
/// # Safety
/// `stream` is a valid stream handle.
pub unsafe fn mem_prefetch_async(
    ptr: DevicePtr,
    bytes: usize,
    location: MemLocation,
    stream: raw::CUstream,
) -> CudaResult<()> {
    fault_point!(Prefetch, "cuMemPrefetchAsync", stream => Ok(()));
    ensure_current_context()?;
    let version = crate::driver::driver_version()?;
    if version >= DriverVersion::CUDA_13_0 {
        static F: OnceLock<CudaResult<PrefetchV2>> = OnceLock::new();
        // SAFETY: `PrefetchV2` is the 13.0 ABI of `cuMemPrefetchAsync`.
        let f = F
            .get_or_init(|| unsafe {
                resolve(
                    "cuMemPrefetchAsync",
                    c"cuMemPrefetchAsync",
                    DriverVersion(13000),
                )
            })
            .clone()?;
        // SAFETY: `stream` is valid (caller); prefetching never changes memory contents.
        check("cuMemPrefetchAsync", unsafe {
            f(ptr.addr(), bytes, location.into(), 0, stream)
        })
    } else {
        static F: OnceLock<CudaResult<PrefetchV1>> = OnceLock::new();
        // SAFETY: `PrefetchV1` is the 8.0-12.x ABI of `cuMemPrefetchAsync`.
        let f = F
            .get_or_init(|| unsafe {
                resolve(
                    "cuMemPrefetchAsync",
                    c"cuMemPrefetchAsync",
                    DriverVersion(8000),
                )
            })
            .clone()?;
        let dev = match location {
            MemLocation::Device(d) => d,
            MemLocation::Host => CU_DEVICE_CPU,
        };
        // SAFETY: as above.
        check("cuMemPrefetchAsync", unsafe {
            f(ptr.addr(), bytes, dev, stream)
        })
    }
}

/// `CU_MEM_ADVISE_SET_PREFERRED_LOCATION`.
pub const MEM_ADVISE_SET_PREFERRED_LOCATION: u32 = 3;

/// `cuMemAdvise` with the legacy device-ordinal ABI (exported by every driver, 13.x included).
///
/// # Safety
/// `[ptr, ptr + bytes)` is managed or system-allocated memory.
pub unsafe fn mem_advise(
    ptr: DevicePtr,
    bytes: usize,
    advice: u32,
    location: MemLocation,
) -> CudaResult<()> {
    ensure_current_context()?;
    static F: OnceLock<CudaResult<AdviseV1>> = OnceLock::new();
    // SAFETY: `AdviseV1` is the 8.0-12.x ABI of `cuMemAdvise`.
    let f = F
        .get_or_init(|| unsafe { resolve("cuMemAdvise", c"cuMemAdvise", DriverVersion(8000)) })
        .clone()?;
    let dev = match location {
        MemLocation::Device(d) => d,
        MemLocation::Host => CU_DEVICE_CPU,
    };
    // SAFETY: the caller's contract; advice does not change contents.
    check("cuMemAdvise", unsafe { f(ptr.addr(), bytes, advice, dev) })
}
