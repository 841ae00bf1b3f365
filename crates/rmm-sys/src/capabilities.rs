//! The capability probes of a device that RMM's resources consult, as plain data (the probe
//! itself, which asks the driver, is [`DeviceCapabilities::probe`] in the device module).

/// Export handle types a memory pool can be created with (RMM's `allocation_handle_type`).
#[doc(alias = "rmm::mr::cuda_async_memory_resource::allocation_handle_type")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AllocationHandleType {
    /// No export handle.
    None = 0,
    /// A POSIX file descriptor (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`).
    PosixFileDescriptor = 0x1,
    /// A Win32 handle.
    Win32 = 0x2,
    /// A Win32 KMT handle.
    Win32Kmt = 0x4,
    /// A fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`).
    Fabric = 0x8,
}

/// The capability probes RMM's resources consult (cached per call site by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCapabilities {
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`: stream-ordered allocation.
    pub memory_pools_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES` as a bitmask of
    /// [`AllocationHandleType`] values.
    pub supported_handle_types: u32,
    /// `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`.
    pub concurrent_managed_access: bool,
    /// `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS` (system-allocated memory usable on the GPU).
    pub pageable_memory_access: bool,
}

impl DeviceCapabilities {
    /// Whether a pool may be created with `handle` as its export handle type.
    #[must_use]
    pub fn supports_handle_type(&self, handle: AllocationHandleType) -> bool {
        handle == AllocationHandleType::None || self.supported_handle_types & handle as u32 != 0
    }
}
