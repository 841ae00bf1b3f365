//! What [`VmmPoolMemoryResource::export_chunks`](crate::VmmPoolMemoryResource::export_chunks)
//! hands out for IPC.

/// The physical memory of one chunk of a VMM pool, exported as a POSIX file descriptor.
///
/// The importing process gets the memory with `rmm_sys::vmm::PhysicalMemory::import_posix_fd`
/// (given `size` and the device) and maps it with `rmm_sys::vmm::Mapping::new` at `offset` of
/// an address range of its own of the pool's size, so that the pool's addresses translate by
/// one constant. Closing the descriptor does not affect the pool.
#[cfg(unix)]
#[derive(Debug)]
pub struct ExportedChunk {
    /// Offset of the chunk from the start of the pool's range.
    pub offset: usize,
    /// Size of the chunk in bytes.
    pub size: usize,
    /// The descriptor (the receiver's to close).
    pub fd: std::os::fd::OwnedFd,
}
