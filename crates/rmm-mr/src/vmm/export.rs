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

/// How the chunks of an exported allocation travel ([`AllocationExport`]).
#[cfg(unix)]
#[derive(Debug)]
pub(crate) enum ChunkExports {
    /// One descriptor per chunk (`AllocationHandleType::PosixFileDescriptor`).
    Fds(Vec<std::os::fd::OwnedFd>),
    /// One fabric handle per chunk (`AllocationHandleType::Fabric`).
    Fabric(Vec<rmm_sys::ipc::FabricHandle>),
}

/// One allocation of a VMM pool, exported for IPC as the chunks that hold it: the importer
/// reserves `span` bytes aligned to `alignment`, maps chunk `i` at `chunks[i].0`, and finds the
/// allocation at `offset`.
#[cfg(unix)]
#[derive(Debug)]
pub(crate) struct AllocationExport {
    pub(crate) device: rmm_sys::DeviceId,
    pub(crate) alignment: usize,
    pub(crate) span: usize,
    pub(crate) offset: usize,
    pub(crate) size: usize,
    /// `(offset in the span, size)` of each chunk.
    pub(crate) chunks: Vec<(usize, usize)>,
    pub(crate) handles: ChunkExports,
}

#[cfg(unix)]
impl crate::VmmPoolMemoryResource {
    /// Exports the physical memory of every chunk as a POSIX file descriptor, for another
    /// process to import (`rmm_sys::vmm::PhysicalMemory::import_posix_fd`) and map at the same
    /// offsets of a range of its own. Needs
    /// [`AllocationHandleType::PosixFileDescriptor`](rmm_sys::AllocationHandleType::PosixFileDescriptor) in the options.
    ///
    /// # Errors
    /// The driver's error when the memory was not created exportable; an invalid argument for a
    /// simulated pool.
    #[cfg(unix)]
    pub fn export_chunks(&self) -> crate::MrResult<Vec<ExportedChunk>> {
        self.mapper().export_chunks()
    }

    /// Exports the chunks under `[ptr, ptr + size)`, an allocation of this pool, as POSIX file
    /// descriptors or fabric handles (as the pool's export handle type says). The allocation's
    /// owner keeps it allocated until the importer released it (`crate::ipc`), so the pool
    /// never unmaps these chunks meanwhile (`release_unused` unmaps only wholly free chunks).
    pub(crate) fn export_allocation(
        &self,
        ptr: rmm_sys::DevicePtr,
        size: usize,
    ) -> crate::MrResult<AllocationExport> {
        use crate::MrError;
        use rmm_sys::AllocationHandleType as H;
        let device = self.device().ok_or_else(|| {
            MrError::invalid_argument(
                "vmm_pool_memory_resource: simulated memory cannot be exported",
            )
        })?;
        let base = self.address_base().addr();
        let start = ptr
            .addr()
            .checked_sub(base)
            .map(|o| o as usize)
            .filter(|&o| {
                size > 0
                    && o.checked_add(size)
                        .is_some_and(|e| e <= self.maximum_pool_size())
            })
            .ok_or_else(|| {
                MrError::invalid_argument(format!(
                    "vmm_pool_memory_resource: {ptr:?} + {size} bytes is not memory of this pool"
                ))
            })?;
        let end = start + size;
        let mut fds = Vec::new();
        let mut fabric = Vec::new();
        let chunks = self
            .mapper()
            .chunks_in(start, end, &mut |offset, len, memory| {
                match memory.handle_type() {
                    H::PosixFileDescriptor => fds.push(memory.export_posix_fd()?),
                    H::Fabric => fabric.push(rmm_sys::ipc::export_fabric(memory)?),
                    other => {
                        return Err(MrError::Unsupported(format!(
                        "vmm_pool_memory_resource: the pool's memory is not exportable (handle \
                         type {other:?}; set `VmmPoolOptions::export_handle_type`)"
                    )))
                    }
                }
                Ok((offset, len))
            })?;
        let Some(&(first, _)) = chunks.first() else {
            return Err(MrError::invalid_argument(format!(
                "vmm_pool_memory_resource: no chunk is mapped under {ptr:?}"
            )));
        };
        let span_end = chunks.last().map_or(first, |&(o, s)| o + s);
        if first > start || span_end < end || chunks.windows(2).any(|w| w[0].0 + w[0].1 != w[1].0) {
            return Err(MrError::invalid_argument(format!(
                "vmm_pool_memory_resource: {ptr:?} + {size} bytes is not wholly mapped"
            )));
        }
        let handles = if fabric.is_empty() {
            ChunkExports::Fds(fds)
        } else if fds.is_empty() {
            ChunkExports::Fabric(fabric)
        } else {
            return Err(MrError::invalid_argument(
                "vmm_pool_memory_resource: chunks of two handle types",
            ));
        };
        Ok(AllocationExport {
            device,
            alignment: self.granularity(),
            span: span_end - first,
            offset: start - first,
            size,
            chunks: chunks.iter().map(|&(o, s)| (o - first, s)).collect(),
            handles,
        })
    }
}
