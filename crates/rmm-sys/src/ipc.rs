//! Sharing memory between processes and between devices: the driver calls behind rmm-mr's `ipc`
//! module and the peer copies of the containers.
//!
//! - **Driver pools** ([`MemPoolHandle`]) made with a POSIX file-descriptor handle type export
//!   the whole pool as a descriptor ([`mem_pool_export_posix_fd`], imported in another process
//!   with [`ImportedMemPool::import_posix_fd`]) and each allocation as 64 opaque bytes
//!   ([`mem_pool_export_pointer`], imported with [`ImportedMemPool::import_pointer`]).
//! - **Physical memory of the virtual memory API** is exported by
//!   [`PhysicalMemory::export_posix_fd`](crate::vmm::PhysicalMemory::export_posix_fd) or, where
//!   the device supports fabric handles ([`fabric_supported`]), as a [`FabricHandle`]
//!   ([`export_fabric`], [`import_fabric`]).
//! - **Peers**: [`can_access_peer`], [`mem_pool_set_access`] and [`memcpy_peer_async`].
//!
//! Every entry point here exists from CUDA 12.0 on; each is resolved once through
//! `cuGetProcAddress` (so the loaded table of `entry.rs` stays as it is) and declared with an
//! integer result, like every other call of rmm-sys.

use std::ffi::{c_int, c_ulonglong, c_void};
use std::fmt;
use std::sync::OnceLock;

use crate::capabilities::AllocationHandleType;
use crate::context::ensure_current_context;
use crate::device::DeviceId;
use crate::driver::resolve;
use crate::entry::{RawAccessDesc, RawMemHandle, RawResult};
use crate::error::{check, CudaError, CudaResult};
use crate::memory::MemLocation;
use crate::mempool::MemPoolHandle;
use crate::ptr::DevicePtr;
use crate::raw;
use crate::version::DriverVersion;
use crate::vmm::PhysicalMemory;

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READ_WRITE: u32 = 3;
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` (not in cudarc's 12.0 bindings).
const ATTRIBUTE_FABRIC_SUPPORTED: c_int = 128;

/// Resolves `$symbol` once (CUDA 12.0 ABI) into a static of type `$ty` and evaluates to it.
macro_rules! entry {
    ($symbol:literal, $c_symbol:literal, $ty:ty) => {{
        static F: OnceLock<CudaResult<$ty>> = OnceLock::new();
        F.get_or_init(|| {
            // SAFETY: `$ty` is the `cuda.h` signature of the symbol as of CUDA 12.0 (each use
            // below names it), with the result read as an integer.
            unsafe { resolve($symbol, $c_symbol, DriverVersion::MINIMUM) }
        })
        .clone()
    }};
}

type ExportPoolFn =
    unsafe extern "C" fn(*mut c_void, raw::CUmemoryPool, u32, c_ulonglong) -> RawResult;
type ImportPoolFn =
    unsafe extern "C" fn(*mut raw::CUmemoryPool, *mut c_void, u32, c_ulonglong) -> RawResult;
type ExportPointerFn = unsafe extern "C" fn(*mut PoolPointerExport, raw::CUdeviceptr) -> RawResult;
type ImportPointerFn = unsafe extern "C" fn(
    *mut raw::CUdeviceptr,
    raw::CUmemoryPool,
    *mut PoolPointerExport,
) -> RawResult;
type PoolSetAccessFn =
    unsafe extern "C" fn(raw::CUmemoryPool, *const RawAccessDesc, usize) -> RawResult;
type PoolDestroyFn = unsafe extern "C" fn(raw::CUmemoryPool) -> RawResult;
type CanAccessPeerFn = unsafe extern "C" fn(*mut c_int, raw::CUdevice, raw::CUdevice) -> RawResult;
type AttributeFn = unsafe extern "C" fn(*mut c_int, c_int, raw::CUdevice) -> RawResult;
type ExportMemFn = unsafe extern "C" fn(*mut c_void, RawMemHandle, u32, c_ulonglong) -> RawResult;
type ImportMemFn = unsafe extern "C" fn(*mut RawMemHandle, *mut c_void, u32) -> RawResult;
type MemcpyPeerAsyncFn = unsafe extern "C" fn(
    raw::CUdeviceptr,
    raw::CUcontext,
    raw::CUdeviceptr,
    raw::CUcontext,
    usize,
    raw::CUstream,
) -> RawResult;

/// `CUmemPoolPtrExportData`: what identifies one allocation of an exported pool (64 opaque
/// bytes, sent to the importing process as they are).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PoolPointerExport {
    /// The driver's bytes.
    pub bytes: [u8; 64],
}

impl fmt::Debug for PoolPointerExport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PoolPointerExport(..)")
    }
}

/// `CUmemFabricHandle`: physical memory exported as a fabric handle (64 opaque bytes, usable
/// in any process of the same fabric, no file descriptor involved).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FabricHandle {
    /// The driver's bytes.
    pub bytes: [u8; 64],
}

impl fmt::Debug for FabricHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FabricHandle(..)")
    }
}

/// Whether physical memory of `device` can be exported as a fabric handle
/// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`; false where the driver does not know
/// the attribute).
pub fn fabric_supported(device: DeviceId) -> CudaResult<bool> {
    let f = entry!("cuDeviceGetAttribute", c"cuDeviceGetAttribute", AttributeFn)?;
    let mut v: c_int = 0;
    // SAFETY: the driver is initialized (`resolve` did it); writes one int.
    let r = unsafe { f(&mut v, ATTRIBUTE_FABRIC_SUPPORTED, device.0) };
    Ok(r == 0 && v != 0)
}

/// `cuDeviceCanAccessPeer`: whether `device` can access memory of `peer` directly.
pub fn can_access_peer(device: DeviceId, peer: DeviceId) -> CudaResult<bool> {
    let f = entry!(
        "cuDeviceCanAccessPeer",
        c"cuDeviceCanAccessPeer",
        CanAccessPeerFn
    )?;
    let mut v: c_int = 0;
    // SAFETY: the driver is initialized; writes one int; bad ordinals are an error code.
    check("cuDeviceCanAccessPeer", unsafe {
        f(&mut v, device.0, peer.0)
    })?;
    Ok(v != 0)
}

fn access_descs(devices: &[DeviceId]) -> Vec<RawAccessDesc> {
    devices
        .iter()
        .map(|d| RawAccessDesc {
            location: MemLocation::Device(d.0).into(),
            flags: ACCESS_READ_WRITE,
        })
        .collect()
}

/// `cuMemPoolSetAccess`: grants every device of `devices` read and write access to the memory
/// of `pool`, present and future (the pool's own device always has it).
///
/// # Safety
/// `pool` is a live pool (see [`MemPoolHandle`]).
pub unsafe fn mem_pool_set_access(pool: MemPoolHandle, devices: &[DeviceId]) -> CudaResult<()> {
    ensure_current_context()?;
    let f = entry!("cuMemPoolSetAccess", c"cuMemPoolSetAccess", PoolSetAccessFn)?;
    let descs = access_descs(devices);
    // SAFETY: the pool is live (caller); the call reads `descs.len()` descriptors.
    check("cuMemPoolSetAccess", unsafe {
        f(pool.as_raw(), descs.as_ptr(), descs.len())
    })
}

/// `cuMemPoolExportToShareableHandle`: the pool as a new POSIX file descriptor, for another
/// process to import ([`ImportedMemPool::import_posix_fd`]). Fails unless the pool was created
/// with [`AllocationHandleType::PosixFileDescriptor`].
///
/// # Safety
/// `pool` is a live pool (see [`MemPoolHandle`]).
#[cfg(unix)]
pub unsafe fn mem_pool_export_posix_fd(pool: MemPoolHandle) -> CudaResult<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    ensure_current_context()?;
    let f = entry!(
        "cuMemPoolExportToShareableHandle",
        c"cuMemPoolExportToShareableHandle",
        ExportPoolFn
    )?;
    let mut fd: c_int = -1;
    // SAFETY: the pool is live (caller); for a POSIX descriptor the call writes one int.
    check("cuMemPoolExportToShareableHandle", unsafe {
        f(
            (&mut fd as *mut c_int).cast(),
            pool.as_raw(),
            AllocationHandleType::PosixFileDescriptor as u32,
            0,
        )
    })?;
    if fd < 0 {
        return Err(CudaError::from_raw_code(
            "cuMemPoolExportToShareableHandle",
            crate::ResultCode::INVALID_VALUE.0,
        ));
    }
    // SAFETY: the driver returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `cuMemPoolExportPointer`: the bytes another process passes to
/// [`ImportedMemPool::import_pointer`] to map the allocation at `ptr`.
///
/// # Safety
/// `ptr` is a live allocation of an exportable pool of this process.
pub unsafe fn mem_pool_export_pointer(ptr: DevicePtr) -> CudaResult<PoolPointerExport> {
    ensure_current_context()?;
    let f = entry!(
        "cuMemPoolExportPointer",
        c"cuMemPoolExportPointer",
        ExportPointerFn
    )?;
    let mut out = PoolPointerExport { bytes: [0; 64] };
    // SAFETY: the allocation is live (caller); the call writes 64 bytes.
    check("cuMemPoolExportPointer", unsafe { f(&mut out, ptr.addr()) })?;
    Ok(out)
}

/// A pool another process exported, imported into this one
/// (`cuMemPoolImportFromShareableHandle`); destroyed on drop (`cuMemPoolDestroy`), which the
/// owner does only after every pointer imported from it was freed
/// ([`mem_free`](crate::memory::mem_free)).
/// Imported pools cannot allocate; they only map the exporter's allocations.
#[derive(Debug)]
pub struct ImportedMemPool {
    pool: MemPoolHandle,
}

impl ImportedMemPool {
    /// Imports the pool behind `fd` (from [`mem_pool_export_posix_fd`] in the exporting
    /// process, received over a Unix socket). The descriptor stays the caller's.
    #[cfg(unix)]
    pub fn import_posix_fd(fd: std::os::fd::BorrowedFd<'_>) -> CudaResult<Self> {
        use std::os::fd::AsRawFd;
        ensure_current_context()?;
        let f = entry!(
            "cuMemPoolImportFromShareableHandle",
            c"cuMemPoolImportFromShareableHandle",
            ImportPoolFn
        )?;
        let mut pool: raw::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: for a POSIX descriptor the handle argument is the descriptor's number (CUDA's
        // documented convention), which the driver only reads; the call writes one handle.
        check("cuMemPoolImportFromShareableHandle", unsafe {
            f(
                &mut pool,
                fd.as_raw_fd() as isize as *mut c_void,
                AllocationHandleType::PosixFileDescriptor as u32,
                0,
            )
        })?;
        Ok(Self {
            pool: MemPoolHandle::from_raw(pool),
        })
    }

    /// The imported pool's handle (live while `self` is).
    #[must_use]
    pub fn handle(&self) -> MemPoolHandle {
        self.pool
    }

    /// Grants `devices` access to the pool's memory in this process (`cuMemPoolSetAccess`):
    /// an importer on another device than the pool's calls it before using its pointers.
    pub fn set_access(&self, devices: &[DeviceId]) -> CudaResult<()> {
        // SAFETY: the pool is live: `self` owns it.
        unsafe { mem_pool_set_access(self.pool, devices) }
    }

    /// `cuMemPoolImportPointer`: maps the exporter's allocation described by `data` into this
    /// process. The memory may be used only once the exporter's allocation has completed (the
    /// exporter synchronizes before it sends `data`).
    ///
    /// # Errors
    /// The driver's error, for example when the exporter already freed the allocation.
    pub fn import_pointer(&self, data: &PoolPointerExport) -> CudaResult<DevicePtr> {
        ensure_current_context()?;
        let f = entry!(
            "cuMemPoolImportPointer",
            c"cuMemPoolImportPointer",
            ImportPointerFn
        )?;
        let mut data = *data;
        let mut ptr: raw::CUdeviceptr = 0;
        // SAFETY: the pool is live (owned by `self`); the call reads 64 bytes and writes one
        // address.
        check("cuMemPoolImportPointer", unsafe {
            f(&mut ptr, self.pool.as_raw(), &mut data)
        })?;
        Ok(DevicePtr::from_raw(ptr))
    }
}

impl Drop for ImportedMemPool {
    fn drop(&mut self) {
        let r = entry!("cuMemPoolDestroy", c"cuMemPoolDestroy", PoolDestroyFn).and_then(|f| {
            // SAFETY: the pool was imported by `import_posix_fd` and is destroyed once.
            check("cuMemPoolDestroy", unsafe { f(self.pool.as_raw()) })
        });
        if let Err(e) = r {
            log::error!("rmm: could not destroy an imported memory pool: {e}");
        }
    }
}

/// Exports physical memory as a [`FabricHandle`] (`cuMemExportToShareableHandle` with
/// `CU_MEM_HANDLE_TYPE_FABRIC`). Fails unless the memory was created with
/// [`AllocationHandleType::Fabric`].
pub fn export_fabric(memory: &PhysicalMemory) -> CudaResult<FabricHandle> {
    ensure_current_context()?;
    let f = entry!(
        "cuMemExportToShareableHandle",
        c"cuMemExportToShareableHandle",
        ExportMemFn
    )?;
    let mut out = FabricHandle { bytes: [0; 64] };
    // SAFETY: the handle is live (owned by `memory`); for a fabric handle the call writes 64
    // bytes.
    check("cuMemExportToShareableHandle", unsafe {
        f(
            (&mut out as *mut FabricHandle).cast(),
            memory.raw_handle(),
            AllocationHandleType::Fabric as u32,
            0,
        )
    })?;
    Ok(out)
}

/// Imports physical memory exported as a [`FabricHandle`] (`size` and `device` are the
/// exporter's); released on drop like any [`PhysicalMemory`].
pub fn import_fabric(
    handle: &FabricHandle,
    size: usize,
    device: DeviceId,
) -> CudaResult<PhysicalMemory> {
    ensure_current_context()?;
    let f = entry!(
        "cuMemImportFromShareableHandle",
        c"cuMemImportFromShareableHandle",
        ImportMemFn
    )?;
    let mut raw_handle: RawMemHandle = 0;
    let mut bytes = *handle;
    // SAFETY: for a fabric handle the handle argument points at the 64 bytes, which the driver
    // only reads; the call writes one handle.
    check("cuMemImportFromShareableHandle", unsafe {
        f(
            &mut raw_handle,
            (&mut bytes as *mut FabricHandle).cast(),
            AllocationHandleType::Fabric as u32,
        )
    })?;
    Ok(PhysicalMemory::from_imported(
        raw_handle,
        size,
        device,
        AllocationHandleType::Fabric,
    ))
}

/// `cuMemcpyPeerAsync`: copies `bytes` from `src` on `src_device` to `dst` on `dst_device`,
/// enqueued on `stream`, through the devices' primary contexts (directly over NVLink or PCIe
/// where peer access is possible, staged through the host otherwise).
///
/// # Safety
/// `stream` is a valid stream; `[src, src + bytes)` is readable memory of `src_device` and
/// `[dst, dst + bytes)` writable memory of `dst_device`, both valid until the copy has run, and
/// no other work writes them meanwhile.
pub unsafe fn memcpy_peer_async(
    dst: DevicePtr,
    dst_device: DeviceId,
    src: DevicePtr,
    src_device: DeviceId,
    bytes: usize,
    stream: raw::CUstream,
) -> CudaResult<()> {
    ensure_current_context()?;
    let f = entry!("cuMemcpyPeerAsync", c"cuMemcpyPeerAsync", MemcpyPeerAsyncFn)?;
    let dst_ctx = crate::context::primary_context(dst_device.0)?;
    let src_ctx = crate::context::primary_context(src_device.0)?;
    // SAFETY: the caller's contract; both contexts are retained for the process.
    check("cuMemcpyPeerAsync", unsafe {
        f(
            dst.addr(),
            dst_ctx.as_raw(),
            src.addr(),
            src_ctx.as_raw(),
            bytes,
            stream,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_records_have_the_driver_layout() {
        assert_eq!(std::mem::size_of::<PoolPointerExport>(), 64);
        assert_eq!(std::mem::size_of::<FabricHandle>(), 64);
        assert_eq!(
            format!("{:?}", FabricHandle { bytes: [1; 64] }),
            "FabricHandle(..)"
        );
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        if crate::is_driver_present() {
            return;
        }
        assert!(can_access_peer(DeviceId(0), DeviceId(1)).is_err());
        assert!(fabric_supported(DeviceId(0)).is_err());
    }
}
