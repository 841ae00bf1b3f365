//! The importing side: [`IpcImporter`] and [`ImportedAllocation`].

use std::collections::HashMap;
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

use rmm_sys::ipc::{FabricHandle, ImportedMemPool, PoolPointerExport};
use rmm_sys::vmm::{AddressRange, Mapping, PhysicalMemory};
use rmm_sys::{DeviceGuard, DeviceId, DevicePtr};

use super::message::{ChunkHandles, Message};
use super::{IpcChannel, IpcError};
use crate::MrError;

/// What the importer and every import share: the channel (closed when the last of them goes,
/// which tells the exporter that nothing is mapped any more) and the imported pools. The
/// channel has two handles, so that a thread blocked in [`IpcImporter::receive`] (holding the
/// reading one) never keeps an import's drop from sending its release.
struct Shared {
    reader: Mutex<IpcChannel>,
    writer: Mutex<IpcChannel>,
    pools: Mutex<HashMap<u64, Arc<ImportedMemPool>>>,
    /// The devices of this process that use the imports (access is granted to each).
    access: Vec<DeviceId>,
}

impl Shared {
    fn reader(&self) -> std::sync::MutexGuard<'_, IpcChannel> {
        self.reader.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, IpcChannel> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The importing end of a connection: receives the exporter's allocations and maps them into
/// this process. See [`IpcExporter`](crate::IpcExporter) for the protocol and its safety
/// contract.
pub struct IpcImporter {
    shared: Arc<Shared>,
}

impl IpcImporter {
    /// An importer over `channel` whose imports are used from the calling thread's current
    /// device.
    ///
    /// # Errors
    /// The driver's error when there is no device.
    pub fn new(channel: IpcChannel) -> Result<Self, IpcError> {
        let device = rmm_sys::current_device().map_err(MrError::from)?;
        Self::with_access(channel, &[device])
    }

    /// An importer whose imports are readable and writable from every device of `devices`
    /// (at least one): a driver pool's access is granted with `cuMemPoolSetAccess`, VMM
    /// chunks are mapped with `cuMemSetAccess` for them. A device other than the memory's
    /// needs peer access to it ([`rmm_sys::ipc::can_access_peer`]).
    ///
    /// # Errors
    /// [`IpcError::Protocol`] for an empty list; [`IpcError::Io`] when the socket's handle
    /// cannot be duplicated.
    pub fn with_access(channel: IpcChannel, devices: &[DeviceId]) -> Result<Self, IpcError> {
        if devices.is_empty() {
            return Err(IpcError::Protocol(
                "an importer needs at least one device to use its imports".into(),
            ));
        }
        let writer = channel.try_clone()?;
        Ok(Self {
            shared: Arc::new(Shared {
                reader: Mutex::new(channel),
                writer: Mutex::new(writer),
                pools: Mutex::new(HashMap::new()),
                access: devices.to_vec(),
            }),
        })
    }

    /// Blocks until the exporter sends an allocation and maps it here.
    ///
    /// # Errors
    /// [`IpcError::PeerClosed`] when the exporter closed the connection; the driver's error of
    /// an import (for a failed pointer import the exporter is sent the release at once);
    /// [`IpcError::Protocol`] for a message out of place.
    pub fn receive(&self) -> Result<ImportedAllocation, IpcError> {
        loop {
            let (m, fds) = self.shared.reader().recv()?;
            match m {
                Message::SharePool { pool_id, device } => self.import_pool(pool_id, device, fds)?,
                Message::PoolPointer {
                    id,
                    pool_id,
                    size,
                    data,
                } => return self.import_pointer(id, pool_id, size, data),
                Message::Vmm {
                    id,
                    device,
                    alignment,
                    span,
                    offset,
                    size,
                    chunks,
                    handles,
                } => {
                    let r = self.import_vmm(
                        DeviceId(device),
                        alignment as usize,
                        span as usize,
                        offset as usize,
                        &chunks,
                        handles,
                        fds,
                    );
                    return self.finish(id, size as usize, DeviceId(device), r);
                }
                Message::Release { .. } => {
                    return Err(IpcError::Protocol(
                        "the exporter sent a release; only exports go this way".into(),
                    ))
                }
            }
        }
    }

    fn import_pool(
        &self,
        pool_id: u64,
        device: i32,
        mut fds: Vec<OwnedFd>,
    ) -> Result<(), IpcError> {
        let fd = fds.pop().ok_or_else(|| {
            IpcError::Protocol("a shared pool came without its descriptor".into())
        })?;
        let pool = ImportedMemPool::import_posix_fd(fd.as_fd()).map_err(MrError::from)?;
        let others: Vec<DeviceId> = self
            .shared
            .access
            .iter()
            .copied()
            .filter(|d| d.0 != device)
            .collect();
        if !others.is_empty() {
            pool.set_access(&others).map_err(MrError::from)?;
        }
        self.shared
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(pool_id, Arc::new(pool));
        Ok(())
    }

    fn import_pointer(
        &self,
        id: u64,
        pool_id: u64,
        size: u64,
        data: [u8; 64],
    ) -> Result<ImportedAllocation, IpcError> {
        let pool = self
            .shared
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&pool_id)
            .cloned();
        let r = match pool {
            None => Err(IpcError::Protocol(format!(
                "a pointer of pool {pool_id:#x}, which was never shared"
            ))),
            Some(pool) => pool
                .import_pointer(&PoolPointerExport { bytes: data })
                .map(|ptr| (ptr, Backing::Pool(pool)))
                .map_err(|e| IpcError::Mr(e.into())),
        };
        self.finish(id, size as usize, self.shared.access[0], r)
    }

    #[allow(clippy::too_many_arguments)]
    fn import_vmm(
        &self,
        device: DeviceId,
        alignment: usize,
        span: usize,
        offset: usize,
        chunks: &[(u64, u64)],
        handles: ChunkHandles,
        fds: Vec<OwnedFd>,
    ) -> Result<(DevicePtr, Backing), IpcError> {
        let range = Arc::new(AddressRange::reserve(span, alignment).map_err(MrError::from)?);
        let mut mappings = Vec::with_capacity(chunks.len());
        for (i, &(o, s)) in chunks.iter().enumerate() {
            let memory = match &handles {
                ChunkHandles::PosixFds => {
                    PhysicalMemory::import_posix_fd(fds[i].as_fd(), s as usize, device)
                }
                ChunkHandles::Fabric(h) => {
                    rmm_sys::ipc::import_fabric(&FabricHandle { bytes: h[i] }, s as usize, device)
                }
            }
            .map_err(MrError::from)?;
            // A failure drops the mappings made so far: unmapped, released, range freed.
            mappings.push(
                Mapping::new(&range, o as usize, memory, &self.shared.access)
                    .map_err(MrError::from)?,
            );
        }
        let ptr = DevicePtr::from_raw(range.base().addr() + offset as u64);
        Ok((ptr, Backing::Vmm(mappings)))
    }

    /// Wraps a successful import, or tells the exporter at once that a failed one holds
    /// nothing.
    fn finish(
        &self,
        id: u64,
        size: usize,
        device: DeviceId,
        r: Result<(DevicePtr, Backing), IpcError>,
    ) -> Result<ImportedAllocation, IpcError> {
        match r {
            Ok((ptr, backing)) => Ok(ImportedAllocation {
                id,
                ptr,
                size,
                device,
                backing: Some(backing),
                shared: Arc::clone(&self.shared),
            }),
            Err(e) => {
                // Nothing of this export is mapped here: it may be freed.
                let _ = self.shared.writer().send(&Message::Release { id }, &[]);
                Err(e)
            }
        }
    }
}

impl fmt::Debug for IpcImporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcImporter")
            .field("access", &self.shared.access)
            .finish_non_exhaustive()
    }
}

/// How an import is mapped.
enum Backing {
    /// A pointer of an imported driver pool (freed with `cuMemFree`; the pool is destroyed
    /// after its last pointer).
    Pool(Arc<ImportedMemPool>),
    /// The exporter's chunks, mapped into a range of this process.
    Vmm(Vec<Mapping>),
}

/// Another process's allocation, mapped into this one. Dropping it synchronizes the devices
/// it may be used from (so no queued work still uses it), unmaps it, and then tells the
/// exporter, which frees the memory only after that message (or after this process ended).
pub struct ImportedAllocation {
    id: u64,
    ptr: DevicePtr,
    size: usize,
    device: DeviceId,
    backing: Option<Backing>,
    shared: Arc<Shared>,
}

impl ImportedAllocation {
    /// The address in this process.
    #[must_use]
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device that uses the import here (the first of the importer's devices), or for a
    /// VMM import the device of the memory.
    #[must_use]
    pub fn device(&self) -> DeviceId {
        self.device
    }

    fn release(&mut self) -> Result<(), IpcError> {
        for &d in &self.shared.access {
            let _guard = DeviceGuard::new(d).map_err(MrError::from)?;
            rmm_sys::device_synchronize().map_err(MrError::from)?;
        }
        match self.backing.take() {
            Some(Backing::Pool(pool)) => {
                // SAFETY: the pointer came from `import_pointer` of `pool` (alive: held here),
                // is freed once, and the devices that may use it were synchronized above.
                let r = unsafe { rmm_sys::memory::mem_free(self.ptr) };
                if let Err(e) = r {
                    // Keep the pool: it cannot be destroyed under a live pointer.
                    std::mem::forget(pool);
                    return Err(MrError::from(e).into());
                }
                drop(pool);
            }
            Some(Backing::Vmm(mappings)) => {
                for m in mappings {
                    // Unmapped and released now; the range goes with the last one.
                    if let Err((m, e)) = m.unmap() {
                        std::mem::forget(m);
                        return Err(MrError::from(e).into());
                    }
                }
            }
            None => {}
        }
        self.shared
            .writer()
            .send(&Message::Release { id: self.id }, &[])
    }
}

impl fmt::Debug for ImportedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedAllocation")
            .field("id", &self.id)
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Drop for ImportedAllocation {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            // The exporter must not free memory this process may still map: keep the
            // connection open for the life of the process (its end then tells the exporter).
            log::error!(
                "rmm: could not release the IPC import {:?} ({e}); its connection stays open \
                 until this process ends",
                self.ptr
            );
            std::mem::forget(Arc::clone(&self.shared));
        }
    }
}
