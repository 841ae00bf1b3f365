//! The exporting side: [`IpcAllocation`] and [`IpcExporter`].

use std::collections::HashSet;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};

use rmm_stream::CudaStreamView;
use rmm_sys::{DeviceId, DevicePtr};

use super::ledger::{Ledger, Returned, Take};
use super::message::{ChunkHandles, Message};
use super::{IpcChannel, IpcError};
use crate::resource::DeviceMemoryResource;
use crate::vmm::ChunkExports;
use crate::{CudaAsyncMemoryResource, MrResult, VmmPoolMemoryResource};

/// Where an [`IpcAllocation`] came from (each keeps its pool alive).
#[derive(Debug, Clone)]
enum Source {
    DriverPool(CudaAsyncMemoryResource),
    Vmm(VmmPoolMemoryResource),
}

/// Device memory to share with another process: an allocation of an exportable pool, owned
/// (freed on drop, on the default stream) like a buffer.
///
/// - [`from_driver_pool`](Self::from_driver_pool): a
///   [`CudaAsyncMemoryResource`] built with
///   `CudaAsyncOptions::export_handle_type(AllocationHandleType::PosixFileDescriptor)`.
/// - [`from_vmm_pool`](Self::from_vmm_pool): a [`VmmPoolMemoryResource`] built with
///   `VmmPoolOptions::export_handle_type(PosixFileDescriptor)` or `(Fabric)`.
///
/// Hand it to [`IpcExporter::export`], which keeps it until the importer released it.
pub struct IpcAllocation {
    source: Source,
    ptr: DevicePtr,
    size: usize,
}

impl IpcAllocation {
    /// `bytes` from the driver pool `pool`, allocated on `stream`.
    ///
    /// # Errors
    /// The pool's allocation error.
    pub fn from_driver_pool(
        pool: &CudaAsyncMemoryResource,
        bytes: usize,
        stream: CudaStreamView<'_>,
    ) -> MrResult<Self> {
        let ptr = pool.allocate(stream, bytes, rmm_sys::ALLOCATION_ALIGNMENT)?;
        Ok(Self {
            source: Source::DriverPool(pool.clone()),
            ptr,
            size: bytes,
        })
    }

    /// `bytes` from the VMM pool `pool`, allocated on `stream`.
    ///
    /// # Errors
    /// The pool's allocation error.
    pub fn from_vmm_pool(
        pool: &VmmPoolMemoryResource,
        bytes: usize,
        stream: CudaStreamView<'_>,
    ) -> MrResult<Self> {
        let ptr = pool.allocate(stream, bytes, rmm_sys::ALLOCATION_ALIGNMENT)?;
        Ok(Self {
            source: Source::Vmm(pool.clone()),
            ptr,
            size: bytes,
        })
    }

    /// The device address (in this process).
    #[must_use]
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device of the memory.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        match &self.source {
            Source::DriverPool(p) => p.device(),
            Source::Vmm(p) => p.device().unwrap_or(DeviceId(0)),
        }
    }
}

impl fmt::Debug for IpcAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcAllocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("source", &self.source)
            .finish()
    }
}

impl Drop for IpcAllocation {
    fn drop(&mut self) {
        let stream = CudaStreamView::default();
        // SAFETY: allocated from this pool with this size and the default alignment, freed
        // once; an exported allocation is dropped only after the importer released it or its
        // connection ended (`IpcExporter`).
        let r = unsafe {
            match &self.source {
                Source::DriverPool(p) => {
                    p.deallocate(stream, self.ptr, self.size, rmm_sys::ALLOCATION_ALIGNMENT)
                }
                Source::Vmm(p) => {
                    p.deallocate(stream, self.ptr, self.size, rmm_sys::ALLOCATION_ALIGNMENT)
                }
            }
        };
        if let Err(e) = r {
            log::error!("rmm: could not free the IPC allocation {self:?}: {e}");
        }
    }
}

/// An export, back from the importer ([`IpcExporter::wait_released`]).
#[derive(Debug)]
pub enum Released {
    /// The importer released it: its work on the memory is done and its mapping is gone.
    ByImporter(IpcAllocation),
    /// The importer's end of the connection closed while the export was outstanding: the
    /// importing process ended (crashed, or exited without releasing). Its mappings went with
    /// it, so the memory is the exporter's again; what the importer wrote is undefined.
    PeerGone(IpcAllocation),
}

impl Released {
    /// The allocation, whichever way it came back.
    #[must_use]
    pub fn into_allocation(self) -> IpcAllocation {
        match self {
            Self::ByImporter(a) | Self::PeerGone(a) => a,
        }
    }

    /// Whether the importer went away without releasing it.
    #[must_use]
    pub fn peer_gone(&self) -> bool {
        matches!(self, Self::PeerGone(_))
    }
}

/// An id of an export, named by [`IpcExporter::wait_released`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExportId(u64);

/// The exporting end of a connection: sends allocations to the importing process and keeps
/// each one allocated until the importer released it.
///
/// # Protocol and safety contract
///
/// Sharing device memory with another process (IPC): an exporter sends allocations of a driver
/// pool or a VMM pool over a Unix socket, an importer maps them into its own address space, and
/// the memory goes back to the exporter only after the importer released it.
///
/// # How it works
///
/// - **Transport.** An [`IpcChannel`](crate::IpcChannel) is a connected Unix stream socket. Each message is a
///   framed record (`message`: a 12-byte header, then the payload); file descriptors travel
///   beside a frame as `SCM_RIGHTS` ancillary data (through nix's `sendmsg`/`recvmsg`), so
///   the receiving process gets its own descriptors for the same driver objects.
/// - **Driver pools.** A [`CudaAsyncMemoryResource`](crate::CudaAsyncMemoryResource) made with
///   `export_handle_type(AllocationHandleType::PosixFileDescriptor)` is sent once as a
///   descriptor (`cuMemPoolExportToShareableHandle`; the importer calls
///   `cuMemPoolImportFromShareableHandle`, and `cuMemPoolSetAccess` for its devices other than
///   the pool's), and each allocation as 64 bytes (`cuMemPoolExportPointer`,
///   `cuMemPoolImportPointer`). The importer frees its pointer with `cuMemFree` and destroys
///   the imported pool after its last pointer.
/// - **VMM pools.** A [`VmmPoolMemoryResource`](crate::VmmPoolMemoryResource) made with
///   `export_handle_type(PosixFileDescriptor)` (or `Fabric`, where
///   `rmm_sys::ipc::fabric_supported` says the device has fabric handles: multi-node NVLink
///   systems) sends the chunks that hold an allocation, one descriptor or fabric handle each
///   (`cuMemExportToShareableHandle`). The importer reserves a range as large as those chunks,
///   maps each at its offset (`cuMemImportFromShareableHandle`, `cuMemMap`, `cuMemSetAccess`
///   for its devices) and finds the allocation at the same offset as in the exporter.
///
/// # Ordering: who may touch the memory when
///
/// 1. **Export after the producer's work.** [`IpcExporter::export`](crate::IpcExporter::export) synchronizes the stream
///    it is given before it sends anything, so the importer never sees memory still being
///    written. Work the exporter enqueues on the allocation afterwards is its own to order.
/// 2. **Release after the importer's work.** Dropping an [`ImportedAllocation`](crate::ImportedAllocation) synchronizes
///    every device the importer uses, unmaps (VMM) or frees (`cuMemFree`, driver pool) the
///    import, and only then sends a `Release` message naming it.
/// 3. **Free after the release.** The exporter keeps each exported [`IpcAllocation`](crate::IpcAllocation) in its
///    ledger until that release arrives ([`IpcExporter::wait_released`](crate::IpcExporter::wait_released) gives it back, or the
///    exporter's drop frees it), so the exporter's free is ordered after the importer's
///    release: the exporting pool cannot hand the memory to someone else while another
///    process still maps it.
/// 4. **A dead importer.** If the importer's end of the socket closes while exports are
///    outstanding, the importing process ended (the importer and every import hold the socket;
///    it closes only after the last import's release, or with the process): its mappings went
///    with it, and the exporter gets each outstanding export back as
///    [`Released::PeerGone`](crate::Released::PeerGone). The exporter's pool stays consistent: the memory is freed into
///    it as usual.
/// 5. **A broken connection.** When a release cannot be sent (or an unmap fails), the
///    importer keeps its socket open for the life of its process instead; when the exporter
///    cannot read (an I/O or protocol error) it leaks the outstanding exports rather than
///    free memory that may still be mapped.
///
/// # Safety contract
///
/// The API is safe: no export or import call can cause undefined behaviour in Rust's sense,
/// and the memory is touched only through `unsafe` copy or kernel calls whose contracts
/// already say it must stay valid while the work runs. What the types cannot see, and the
/// caller vouches for:
///
/// - The socket under an [`IpcChannel`](crate::IpcChannel) is used only by it: no other copy of the descriptor
///   (`UnixStream::try_clone` before the conversion, a `fork` without `exec`) closes or shuts
///   it down early, since the end of the stream stands for "the importer holds nothing".
/// - An importing process does not enqueue work on an import without ordering it before the
///   import's drop (the drop synchronizes the importer's devices, which covers every stream of
///   theirs; work of another process it passed the address to is not covered).
/// - The exporter reads what the importer wrote only after [`IpcExporter::wait_released`](crate::IpcExporter::wait_released)
///   returned [`Released::ByImporter`](crate::Released::ByImporter) (after [`Released::PeerGone`](crate::Released::PeerGone) the contents are
///   undefined).
///
/// Dropping an [`IpcExporter`](crate::IpcExporter) blocks until its importer released everything or went away.
///
/// **Dropping it blocks** until every outstanding export was released or the connection ended
/// (the importer's process exits or drops its importer and imports), then frees them: the
/// exporter's free is ordered after the importer's release. Do not drop it on a thread the
/// importer needs to make progress.
pub struct IpcExporter {
    channel: IpcChannel,
    ledger: Ledger<IpcAllocation>,
    /// The driver pools sent to the importer already (by handle).
    shared_pools: HashSet<usize>,
}

impl IpcExporter {
    /// An exporter over `channel` (connected to the importing process).
    #[must_use]
    pub fn new(channel: IpcChannel) -> Self {
        Self {
            channel,
            ledger: Ledger::default(),
            shared_pools: HashSet::new(),
        }
    }

    /// Sends `allocation` to the importer: synchronizes `stream` first (the work that filled
    /// it must be complete before another process reads it), then sends the pool's handle (the
    /// first time a driver pool is used) and the allocation's. The exporter keeps the
    /// allocation until [`wait_released`](Self::wait_released) gives it back.
    ///
    /// # Errors
    /// A failed synchronization or export (the driver's error, for example for a pool made
    /// without an export handle type), or a failed send; the allocation is freed then (nothing
    /// imported it).
    pub fn export(
        &mut self,
        allocation: IpcAllocation,
        stream: CudaStreamView<'_>,
    ) -> Result<ExportId, IpcError> {
        stream.synchronize().map_err(crate::MrError::from)?;
        let ptr = allocation.ptr;
        let size = allocation.size;
        let source = allocation.source.clone();
        let id = self.ledger.insert(allocation);
        let sent = self.send_export(id, &source, ptr, size);
        if let Err(e) = sent {
            // Nothing imported it: free it now.
            drop(self.ledger.cancel(id));
            return Err(e);
        }
        Ok(ExportId(id))
    }

    fn send_export(
        &mut self,
        id: u64,
        source: &Source,
        ptr: DevicePtr,
        size: usize,
    ) -> Result<(), IpcError> {
        match source {
            Source::DriverPool(pool) => {
                let handle = pool.pool_handle();
                let pool_id = handle.as_raw() as usize;
                if !self.shared_pools.contains(&pool_id) {
                    // SAFETY: `pool` owns the pool, so it is live.
                    let fd = unsafe { rmm_sys::ipc::mem_pool_export_posix_fd(handle) }
                        .map_err(crate::MrError::from)?;
                    self.channel.send(
                        &Message::SharePool {
                            pool_id: pool_id as u64,
                            device: pool.device().0,
                        },
                        &[fd.as_fd()],
                    )?;
                    self.shared_pools.insert(pool_id);
                }
                // SAFETY: `ptr` is a live allocation of `pool` (the ledger owns it).
                let data = unsafe { rmm_sys::ipc::mem_pool_export_pointer(ptr) }
                    .map_err(crate::MrError::from)?;
                self.channel.send(
                    &Message::PoolPointer {
                        id,
                        pool_id: pool_id as u64,
                        size: size as u64,
                        data: data.bytes,
                    },
                    &[],
                )
            }
            Source::Vmm(pool) => {
                let e = pool.export_allocation(ptr, size)?;
                let (handles, fds) = match &e.handles {
                    ChunkExports::Fds(fds) => (ChunkHandles::PosixFds, fds.as_slice()),
                    ChunkExports::Fabric(h) => (
                        ChunkHandles::Fabric(h.iter().map(|h| h.bytes).collect()),
                        &[][..],
                    ),
                };
                let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
                self.channel.send(
                    &Message::Vmm {
                        id,
                        device: e.device.0,
                        alignment: e.alignment as u64,
                        span: e.span as u64,
                        offset: e.offset as u64,
                        size: e.size as u64,
                        chunks: e
                            .chunks
                            .iter()
                            .map(|&(o, s)| (o as u64, s as u64))
                            .collect(),
                        handles,
                    },
                    &borrowed,
                )
            }
        }
    }

    /// Blocks until the importer released export `id` (or its connection ended) and gives the
    /// allocation back: then the importer's work on it is complete and its mapping gone, so the
    /// exporter may read what the importer wrote, or free it.
    ///
    /// # Errors
    /// [`IpcError::UnknownExport`] for an id not outstanding; a broken or garbled connection
    /// ([`IpcError::Io`], [`IpcError::Protocol`]): the export then stays recorded and is never
    /// freed (leaked at the exporter's drop, not freed under a possible mapping).
    pub fn wait_released(&mut self, id: ExportId) -> Result<Released, IpcError> {
        loop {
            match self.ledger.take(id.0) {
                Take::Back(Returned::Released(a)) => return Ok(Released::ByImporter(a)),
                Take::Back(Returned::Orphaned(a)) => return Ok(Released::PeerGone(a)),
                Take::Unknown => return Err(IpcError::UnknownExport(id.0)),
                Take::Wait => self.read_one()?,
            }
        }
    }

    /// Exports not yet released.
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.ledger.outstanding()
    }

    /// Reads one message from the importer.
    fn read_one(&mut self) -> Result<(), IpcError> {
        match self.channel.recv() {
            Ok((Message::Release { id }, _)) => self.ledger.release(id).map_err(IpcError::Protocol),
            Ok((other, _)) => Err(IpcError::Protocol(format!(
                "the importer sent {other:?}; only releases go this way"
            ))),
            Err(IpcError::PeerClosed) => {
                self.ledger.close();
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl fmt::Debug for IpcExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcExporter")
            .field("outstanding", &self.ledger.outstanding())
            .field("closed", &self.ledger.is_closed())
            .finish_non_exhaustive()
    }
}

impl Drop for IpcExporter {
    fn drop(&mut self) {
        while self.ledger.outstanding() > 0 && !self.ledger.is_closed() {
            if let Err(e) = self.read_one() {
                let left = self.ledger.drain_all();
                log::error!(
                    "rmm: the IPC connection failed ({e}) with {} export(s) outstanding; they \
                     are leaked, not freed under the importer's mappings",
                    left.len()
                );
                for a in left {
                    std::mem::forget(a);
                }
                return;
            }
        }
        drop(self.ledger.drain_returned());
    }
}
