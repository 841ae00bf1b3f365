//! CUDA's virtual memory management API as owned handles: a reserved range of device addresses
//! ([`AddressRange`]), physical memory ([`PhysicalMemory`]) and a mapping of the one into the
//! other with access granted to chosen devices ([`Mapping`]).
//!
//! This is what lets a pool grow without moving: reserve a large range once, then map physical
//! memory at its end as needed, so the pool's memory stays one contiguous range of addresses
//! (PyTorch's "expandable segments"; rmm-mr's `VmmPoolMemoryResource`).
//!
//! - **Ownership and drop order.** A [`Mapping`] owns its physical memory and shares its range
//!   (an [`Arc`]), so whatever the order values are dropped in, the driver sees what it needs:
//!   the mapping is unmapped first, its physical memory released next, and the address range
//!   freed only after the last mapping into it is gone (`cuMemUnmap`, `cuMemRelease`,
//!   `cuMemAddressFree`). A failure of one of these in a `drop` is logged, never a panic.
//! - **Stream ordering** is the caller's. Unmapping memory that queued device work still uses is
//!   undefined behaviour on the device (the work faults or reads another mapping): an owner
//!   synchronizes (or waits on events covering every use) before it drops or
//!   [`unmap`](Mapping::unmap)s a mapping, exactly as before freeing any device memory. Safe
//!   code cannot enqueue work on these addresses: the copy and kernel wrappers that take a raw
//!   address are `unsafe` and ask that the memory stays valid while the work runs.
//! - **Faults**: with the `testing` feature, `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap` and
//!   `cuMemSetAccess`, and `cuMemUnmap` are fault points ([`crate::fault`], kinds
//!   `AddressReserve`, `MemCreate`, `MemMap`, `MemUnmap`); they are never simulated.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys;

use crate::capabilities::AllocationHandleType;
use crate::context::context_api;
use crate::device::{device_attribute, DeviceId};
use crate::entry::{RawAccessDesc, RawAllocationProp, RawMemHandle};
use crate::error::{check, CudaError, CudaResult};
use crate::memory::MemLocation;
use crate::ptr::DevicePtr;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: ordinary device memory.
const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READ_WRITE: u32 = 3;

/// Whether `device` and its driver support the virtual memory management API
/// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
pub fn vmm_supported(device: DeviceId) -> CudaResult<bool> {
    Ok(device_attribute(
        device,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    )? != 0)
}

/// Whether physical memory of `device` can be exported as a POSIX file descriptor
/// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`).
pub fn posix_fd_supported(device: DeviceId) -> CudaResult<bool> {
    Ok(device_attribute(
        device,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    )? != 0)
}

/// Which granularity [`allocation_granularity`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`: what sizes and offsets must be multiples of.
    Minimum,
    /// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`: what the driver recommends for performance.
    Recommended,
}

fn allocation_prop(device: DeviceId, handle_type: AllocationHandleType) -> RawAllocationProp {
    RawAllocationProp {
        alloc_type: ALLOCATION_TYPE_PINNED,
        requested_handle_types: handle_type as u32,
        location: MemLocation::Device(device.0).into(),
        win32_handle_metadata: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// `cuMemGetAllocationGranularity` for device memory of `device` exportable as `handle_type`:
/// the size every physical allocation and mapping must be a multiple of.
pub fn allocation_granularity(
    device: DeviceId,
    handle_type: AllocationHandleType,
    which: Granularity,
) -> CudaResult<usize> {
    let api = context_api()?;
    let prop = allocation_prop(device, handle_type);
    let option = match which {
        Granularity::Minimum => 0,
        Granularity::Recommended => 1,
    };
    let mut granularity = 0usize;
    // SAFETY: a context is current; the call reads the properties and writes one size.
    check("cuMemGetAllocationGranularity", unsafe {
        (api.cuMemGetAllocationGranularity)(&mut granularity, &prop, option)
    })?;
    Ok(granularity)
}

/// A reserved range of device virtual addresses (`cuMemAddressReserve`), freed on drop
/// (`cuMemAddressFree`). Nothing is mapped in it until a [`Mapping`] is made; share it with an
/// [`Arc`] to map into it (every mapping keeps it alive).
pub struct AddressRange {
    base: u64,
    size: usize,
}

impl AddressRange {
    /// Reserves `size` bytes of addresses aligned to `alignment` (0: the driver's default).
    /// `size` must be a multiple of the [minimum granularity](allocation_granularity); the
    /// driver refuses it otherwise (an error).
    pub fn reserve(size: usize, alignment: usize) -> CudaResult<Self> {
        fault_point!(AddressReserve, "cuMemAddressReserve");
        let api = context_api()?;
        let mut base = 0;
        // SAFETY: a context is current; the call writes one address (no fixed address asked).
        check("cuMemAddressReserve", unsafe {
            (api.cuMemAddressReserve)(&mut base, size, alignment, 0, 0)
        })?;
        Ok(Self { base, size })
    }

    /// The first address of the range.
    #[must_use]
    pub fn base(&self) -> DevicePtr {
        DevicePtr::from_raw(self.base)
    }

    /// The size of the range in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }
}

impl fmt::Debug for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressRange")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        let r = context_api().and_then(|api| {
            // SAFETY: the range was reserved by `reserve` with this size and is freed once; every
            // mapping into it held an `Arc` of it, so none is left.
            check("cuMemAddressFree", unsafe {
                (api.cuMemAddressFree)(self.base, self.size)
            })
        });
        if let Err(e) = r {
            log::error!("rmm: could not free the address range {self:?}: {e}");
        }
    }
}

/// Physical device memory (`cuMemCreate`), released on drop (`cuMemRelease`; the driver frees
/// the memory once no mapping uses it either). It has no address until a [`Mapping`] maps it.
pub struct PhysicalMemory {
    handle: RawMemHandle,
    size: usize,
    device: DeviceId,
    handle_type: AllocationHandleType,
}

impl PhysicalMemory {
    /// `size` bytes of memory on `device` (a multiple of its
    /// [granularity](allocation_granularity)), exportable as `handle_type`
    /// ([`AllocationHandleType::None`]: not exportable). Out of memory is an error for which
    /// [`CudaError::is_out_of_memory`] holds.
    pub fn create(
        device: DeviceId,
        size: usize,
        handle_type: AllocationHandleType,
    ) -> CudaResult<Self> {
        fault_point!(MemCreate, "cuMemCreate");
        let api = context_api()?;
        let prop = allocation_prop(device, handle_type);
        let mut handle: RawMemHandle = 0;
        // SAFETY: a context is current; the call reads the properties and writes one handle.
        check("cuMemCreate", unsafe {
            (api.cuMemCreate)(&mut handle, size, &prop, 0)
        })?;
        Ok(Self {
            handle,
            size,
            device,
            handle_type,
        })
    }

    /// Imports memory another process (or this one) exported as a POSIX file descriptor
    /// ([`export_posix_fd`](Self::export_posix_fd)); `size` and `device` are the exporter's.
    /// The descriptor stays the caller's.
    #[cfg(unix)]
    pub fn import_posix_fd(
        fd: std::os::fd::BorrowedFd<'_>,
        size: usize,
        device: DeviceId,
    ) -> CudaResult<Self> {
        use std::os::fd::AsRawFd;
        let api = context_api()?;
        let mut handle: RawMemHandle = 0;
        let kind = AllocationHandleType::PosixFileDescriptor;
        // SAFETY: a context is current; for a POSIX descriptor the "OS handle" argument is the
        // descriptor's number itself (CUDA's documented convention), which the driver only reads.
        check("cuMemImportFromShareableHandle", unsafe {
            (api.cuMemImportFromShareableHandle)(
                &mut handle,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                kind as u32,
            )
        })?;
        Ok(Self {
            handle,
            size,
            device,
            handle_type: kind,
        })
    }

    /// Exports the memory as a new POSIX file descriptor (`cuMemExportToShareableHandle`), which
    /// another process imports with [`import_posix_fd`](Self::import_posix_fd). Fails unless
    /// the memory was created with [`AllocationHandleType::PosixFileDescriptor`].
    #[cfg(unix)]
    pub fn export_posix_fd(&self) -> CudaResult<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        let api = context_api()?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: a context is current; the handle is live (owned by `self`); for a POSIX
        // descriptor the call writes one int.
        check("cuMemExportToShareableHandle", unsafe {
            (api.cuMemExportToShareableHandle)(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.handle,
                AllocationHandleType::PosixFileDescriptor as u32,
                0,
            )
        })?;
        if fd < 0 {
            return Err(CudaError::from_raw_code(
                "cuMemExportToShareableHandle",
                crate::ResultCode::INVALID_VALUE.0,
            ));
        }
        // SAFETY: the driver returned a new descriptor that nothing else owns.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// Memory imported by `crate::ipc` (fabric handles), released on drop like any other.
    pub(crate) fn from_imported(
        handle: RawMemHandle,
        size: usize,
        device: DeviceId,
        handle_type: AllocationHandleType,
    ) -> Self {
        Self {
            handle,
            size,
            device,
            handle_type,
        }
    }

    /// The driver's handle (live while `self` is), for `crate::ipc`'s exports.
    pub(crate) fn raw_handle(&self) -> RawMemHandle {
        self.handle
    }

    /// The size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device the memory lives on.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The export handle type it was created with.
    #[must_use]
    pub fn handle_type(&self) -> AllocationHandleType {
        self.handle_type
    }
}

impl fmt::Debug for PhysicalMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PhysicalMemory")
            .field("size", &self.size)
            .field("device", &self.device)
            .field("handle_type", &self.handle_type)
            .finish_non_exhaustive()
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        let r = context_api().and_then(|api| {
            // SAFETY: the handle came from `cuMemCreate` (or an import) and is released once.
            check("cuMemRelease", unsafe { (api.cuMemRelease)(self.handle) })
        });
        if let Err(e) = r {
            log::error!("rmm: could not release physical memory {self:?}: {e}");
        }
    }
}

/// Physical memory mapped at an offset of a reserved [`AddressRange`] (`cuMemMap`), readable
/// and writable from the devices it was made for (`cuMemSetAccess`). Dropping it unmaps it
/// (`cuMemUnmap`), then releases the memory, then lets go of the range; see the
/// [module documentation](self) for the stream-ordering duty of its owner.
pub struct Mapping {
    addr: u64,
    /// Dropped after the unmap, before the range.
    memory: Option<PhysicalMemory>,
    range: Arc<AddressRange>,
}

impl Mapping {
    /// Maps `memory` at `offset` bytes into `range` and grants every device of `access` read
    /// and write access to it (the memory's own device must be among them to use it there).
    /// On failure nothing stays mapped and the memory is released.
    ///
    /// # Errors
    ///
    /// An invalid-value error when `[offset, offset + size)` does not lie in the range or
    /// `access` is empty; the driver's error of `cuMemMap` (for example a misaligned offset, or
    /// addresses already mapped) or `cuMemSetAccess`.
    pub fn new(
        range: &Arc<AddressRange>,
        offset: usize,
        memory: PhysicalMemory,
        access: &[DeviceId],
    ) -> CudaResult<Self> {
        let size = memory.size;
        let fits = offset
            .checked_add(size)
            .is_some_and(|end| end <= range.size);
        if !fits || access.is_empty() || size == 0 {
            return Err(CudaError::Call {
                call: "cuMemMap",
                code: crate::ResultCode::INVALID_VALUE,
                name: "CUDA_ERROR_INVALID_VALUE".into(),
                description: format!(
                    "cannot map {size} bytes at offset {offset} of a {}-byte range for {} \
                     device(s)",
                    range.size,
                    access.len()
                ),
            });
        }
        let addr = range.base + offset as u64;
        map(addr, &memory)?;
        let mapping = Self {
            addr,
            memory: Some(memory),
            range: Arc::clone(range),
        };
        // A failure drops `mapping`: unmapped, then released.
        set_access(addr, size, access)?;
        Ok(mapping)
    }

    /// The first mapped address.
    #[must_use]
    pub fn addr(&self) -> DevicePtr {
        DevicePtr::from_raw(self.addr)
    }

    /// The mapped size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.memory.as_ref().map_or(0, |m| m.size)
    }

    /// The physical memory mapped here.
    #[must_use]
    pub fn memory(&self) -> Option<&PhysicalMemory> {
        self.memory.as_ref()
    }

    /// The range the memory is mapped into.
    #[must_use]
    pub fn range(&self) -> &Arc<AddressRange> {
        &self.range
    }

    /// Unmaps the memory now and gives it back, still allocated, so that a failure is seen: on
    /// error the mapping is returned as it was, still mapped.
    ///
    /// # Errors
    ///
    /// The error of `cuMemUnmap`, with the mapping.
    pub fn unmap(mut self) -> Result<PhysicalMemory, (Self, CudaError)> {
        if let Err(e) = unmap(self.addr, self.size()) {
            return Err((self, e));
        }
        match self.memory.take() {
            Some(memory) => Ok(memory),
            // Only `unmap` empties it, and it consumes the mapping: never reached.
            None => Err((
                self,
                CudaError::from_raw_code("cuMemUnmap", crate::ResultCode::INVALID_HANDLE.0),
            )),
        }
    }
}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size())
            .finish_non_exhaustive()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let Some(memory) = &self.memory else {
            return;
        };
        if let Err(e) = unmap(self.addr, memory.size) {
            log::error!("rmm: could not unmap {self:?}: {e}");
        }
        // Then `memory` (released) and `range` (freed with its last mapping) drop, in that order.
    }
}

fn map(addr: u64, memory: &PhysicalMemory) -> CudaResult<()> {
    fault_point!(MemMap, "cuMemMap");
    let api = context_api()?;
    // SAFETY: `addr` lies in a range this process reserved (checked by the caller) and the
    // handle is live; the driver refuses addresses that are already mapped.
    check("cuMemMap", unsafe {
        (api.cuMemMap)(addr, memory.size, 0, memory.handle, 0)
    })
}

fn set_access(addr: u64, size: usize, access: &[DeviceId]) -> CudaResult<()> {
    fault_point!(MemMap, "cuMemSetAccess");
    let api = context_api()?;
    let descs: Vec<RawAccessDesc> = access
        .iter()
        .map(|d| RawAccessDesc {
            location: MemLocation::Device(d.0).into(),
            flags: ACCESS_READ_WRITE,
        })
        .collect();
    // SAFETY: `[addr, addr + size)` is mapped (just now, by the caller); the call reads
    // `descs.len()` descriptors.
    check("cuMemSetAccess", unsafe {
        (api.cuMemSetAccess)(addr, size, descs.as_ptr(), descs.len())
    })
}

fn unmap(addr: u64, size: usize) -> CudaResult<()> {
    fault_point!(MemUnmap, "cuMemUnmap");
    let api = context_api()?;
    // SAFETY: `[addr, addr + size)` is exactly one live mapping of this process (its owner
    // calls this once); stream ordering is the owner's duty (module documentation).
    check("cuMemUnmap", unsafe { (api.cuMemUnmap)(addr, size) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_every_call_is_an_error() {
        if crate::is_driver_present() {
            return; // the GPU tests (tests/gpu_sys.rs) cover the calls with a driver.
        }
        let none = Some(CudaError::DriverNotFound);
        assert_eq!(vmm_supported(DeviceId(0)).err(), none);
        assert_eq!(
            allocation_granularity(
                DeviceId(0),
                AllocationHandleType::None,
                Granularity::Recommended
            )
            .err(),
            none
        );
        assert_eq!(AddressRange::reserve(1 << 21, 0).err(), none);
        assert_eq!(
            PhysicalMemory::create(DeviceId(0), 1 << 21, AllocationHandleType::None).err(),
            none
        );
    }

    #[cfg(feature = "testing")]
    #[test]
    fn faults_fire_before_the_driver_is_looked_for() {
        use crate::fault::{self, DriverCall, Fault, FaultScope};
        let _scope = FaultScope::simulated();
        fault::inject(Fault::next(DriverCall::AddressReserve));
        let e = AddressRange::reserve(1 << 21, 0).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(e.to_string().contains("cuMemAddressReserve"), "{e}");
        fault::inject(Fault::next(DriverCall::MemCreate));
        let e =
            PhysicalMemory::create(DeviceId(0), 1 << 21, AllocationHandleType::None).unwrap_err();
        assert!(
            e.is_out_of_memory() && e.to_string().contains("cuMemCreate"),
            "{e}"
        );
        // Memory calls are never simulated, even with the simulation on.
        assert!(!DriverCall::MemMap.is_simulated() && !DriverCall::MemUnmap.is_simulated());
        assert_eq!(fault::injected(DriverCall::AddressReserve), 1);
        assert_eq!(fault::injected(DriverCall::MemCreate), 1);
    }
}
