//! Sharing device memory with another process (IPC): an exporter sends allocations of a driver
//! pool or a VMM pool over a Unix socket, an importer maps them into its own address space, and
//! the memory goes back to the exporter only after the importer released it.
//!
//! # How it works
//!
//! - **Transport.** An [`IpcChannel`] is a connected Unix stream socket. Each message is a
//!   framed record (`message`: a 12-byte header, then the payload); file descriptors travel
//!   beside a frame as `SCM_RIGHTS` ancillary data (through nix's `sendmsg`/`recvmsg`), so
//!   the receiving process gets its own descriptors for the same driver objects.
//! - **Driver pools.** A [`CudaAsyncMemoryResource`](crate::CudaAsyncMemoryResource) made with
//!   `export_handle_type(AllocationHandleType::PosixFileDescriptor)` is sent once as a
//!   descriptor (`cuMemPoolExportToShareableHandle`; the importer calls
//!   `cuMemPoolImportFromShareableHandle`, and `cuMemPoolSetAccess` for its devices other than
//!   the pool's), and each allocation as 64 bytes (`cuMemPoolExportPointer`,
//!   `cuMemPoolImportPointer`). The importer frees its pointer with `cuMemFree` and destroys
//!   the imported pool after its last pointer.
//! - **VMM pools.** A [`VmmPoolMemoryResource`](crate::VmmPoolMemoryResource) made with
//!   `export_handle_type(PosixFileDescriptor)` (or `Fabric`, where
//!   [`rmm_sys::ipc::fabric_supported`] says the device has fabric handles: multi-node NVLink
//!   systems) sends the chunks that hold an allocation, one descriptor or fabric handle each
//!   (`cuMemExportToShareableHandle`). The importer reserves a range as large as those chunks,
//!   maps each at its offset (`cuMemImportFromShareableHandle`, `cuMemMap`, `cuMemSetAccess`
//!   for its devices) and finds the allocation at the same offset as in the exporter.
//!
//! # Ordering: who may touch the memory when
//!
//! 1. **Export after the producer's work.** [`IpcExporter::export`] synchronizes the stream
//!    it is given before it sends anything, so the importer never sees memory still being
//!    written. Work the exporter enqueues on the allocation afterwards is its own to order.
//! 2. **Release after the importer's work.** Dropping an [`ImportedAllocation`] synchronizes
//!    every device the importer uses, unmaps (VMM) or frees (`cuMemFree`, driver pool) the
//!    import, and only then sends a `Release` message naming it.
//! 3. **Free after the release.** The exporter keeps each exported [`IpcAllocation`] in its
//!    ledger until that release arrives ([`IpcExporter::wait_released`] gives it back, or the
//!    exporter's drop frees it), so the exporter's free is ordered after the importer's
//!    release: the exporting pool cannot hand the memory to someone else while another
//!    process still maps it.
//! 4. **A dead importer.** If the importer's end of the socket closes while exports are
//!    outstanding, the importing process ended (the importer and every import hold the socket;
//!    it closes only after the last import's release, or with the process): its mappings went
//!    with it, and the exporter gets each outstanding export back as
//!    [`Released::PeerGone`]. The exporter's pool stays consistent: the memory is freed into
//!    it as usual.
//! 5. **A broken connection.** When a release cannot be sent (or an unmap fails), the
//!    importer keeps its socket open for the life of its process instead; when the exporter
//!    cannot read (an I/O or protocol error) it leaks the outstanding exports rather than
//!    free memory that may still be mapped.
//!
//! # Safety contract
//!
//! The API is safe: no export or import call can cause undefined behaviour in Rust's sense,
//! and the memory is touched only through `unsafe` copy or kernel calls whose contracts
//! already say it must stay valid while the work runs. What the types cannot see, and the
//! caller vouches for:
//!
//! - The socket under an [`IpcChannel`] is used only by it: no other copy of the descriptor
//!   (`UnixStream::try_clone` before the conversion, a `fork` without `exec`) closes or shuts
//!   it down early, since the end of the stream stands for "the importer holds nothing".
//! - An importing process does not enqueue work on an import without ordering it before the
//!   import's drop (the drop synchronizes the importer's devices, which covers every stream of
//!   theirs; work of another process it passed the address to is not covered).
//! - The exporter reads what the importer wrote only after [`IpcExporter::wait_released`]
//!   returned [`Released::ByImporter`] (after [`Released::PeerGone`] the contents are
//!   undefined).
//!
//! Dropping an [`IpcExporter`] blocks until its importer released everything or went away.

mod channel;
mod export;
mod import;
mod ledger;
mod message;

pub use channel::IpcChannel;
pub use export::{ExportId, IpcAllocation, IpcExporter, Released};
pub use import::{ImportedAllocation, IpcImporter};

use std::fmt;

/// What can go wrong between the two processes.
#[derive(Debug)]
#[non_exhaustive]
pub enum IpcError {
    /// The socket failed.
    Io(std::io::Error),
    /// The other process ended the connection.
    PeerClosed,
    /// The other process sent something the protocol does not allow (or a message was over
    /// the limits); the text says what.
    Protocol(String),
    /// [`IpcExporter::wait_released`] was asked for an export that is not outstanding.
    UnknownExport(u64),
    /// An allocation, a synchronization or a driver call failed.
    Mr(crate::MrError),
}

impl fmt::Display for IpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "IPC socket error: {e}"),
            Self::PeerClosed => f.write_str("the other process closed the IPC connection"),
            Self::Protocol(why) => write!(f, "IPC protocol error: {why}"),
            Self::UnknownExport(id) => write!(f, "export {id} is not outstanding"),
            Self::Mr(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for IpcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            Self::Mr(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for IpcError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<crate::MrError> for IpcError {
    fn from(e: crate::MrError) -> Self {
        Self::Mr(e)
    }
}
