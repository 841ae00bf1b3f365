//! Example `ipc` (guide: "Sharing memory between processes"): two processes share device
//! memory. The parent allocates 64 MiB from an exportable driver pool and 6 MiB from an
//! exportable VMM pool, fills them, and sends them over a Unix socket to a child (this program
//! again, with `RMM_EXAMPLE_IPC_SOCKET` set), which maps them, checks the parent's bytes and
//! writes its own; the parent reads those once the child released the memory. Without a GPU it
//! says so in one line and exits with status 1.

use std::os::unix::net::UnixListener;
use std::process::{Command, ExitCode};

use rmm::mr::{
    CudaAsyncMemoryResource, CudaAsyncOptions, IpcAllocation, IpcChannel, IpcError, IpcExporter,
    IpcImporter, Released, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm::stream::CudaStreamView;
use rmm::sys::{memory, AllocationHandleType, DevicePtr};

const SOCKET: &str = "RMM_EXAMPLE_IPC_SOCKET";
const MIB: usize = 1 << 20;
const PARENT: u8 = 0xA5;
const CHILD: u8 = 0x5A;

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example ipc: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    let r = match std::env::var(SOCKET) {
        Ok(path) => child(&path),
        Err(_) => parent(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example ipc failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn fill(ptr: DevicePtr, bytes: usize, value: u8) -> Result<(), IpcError> {
    let s = CudaStreamView::default();
    // SAFETY: `ptr` holds `bytes` bytes that the caller owns or imported; the call waits.
    unsafe { memory::memset_d8_async(ptr, value, bytes, s.as_raw()) }
        .map_err(rmm::MrError::from)?;
    s.synchronize().map_err(rmm::MrError::from)?;
    Ok(())
}

fn all_equal(ptr: DevicePtr, bytes: usize, value: u8) -> Result<bool, IpcError> {
    let mut host = vec![0u8; bytes];
    // SAFETY: `ptr` holds `bytes` readable bytes; the call waits.
    unsafe { memory::copy_to_host_sync(&mut host, ptr, CudaStreamView::default().as_raw()) }
        .map_err(rmm::MrError::from)?;
    Ok(host.iter().all(|&b| b == value))
}

/// The importing process: two imports, each checked, written and released (by its drop).
fn child(path: &str) -> Result<(), IpcError> {
    let importer = IpcImporter::new(IpcChannel::connect(path)?)?;
    for _ in 0..2 {
        let import = importer.receive()?;
        let ok = all_equal(import.ptr(), import.size(), PARENT)?;
        println!(
            "  child: imported {} MiB at {:?}, parent's bytes {}",
            import.size() / MIB,
            import.ptr(),
            if ok { "read back" } else { "WRONG" }
        );
        fill(import.ptr(), import.size(), CHILD)?;
    }
    Ok(())
}

fn parent() -> Result<(), IpcError> {
    let s = CudaStreamView::default();
    let driver = CudaAsyncMemoryResource::with_options(
        CudaAsyncOptions::default().export_handle_type(AllocationHandleType::PosixFileDescriptor),
    )?;
    let vmm = VmmPoolMemoryResource::with_options(
        VmmPoolOptions::new(256 * MIB)
            .granularity(2 * MIB)
            .export_handle_type(AllocationHandleType::PosixFileDescriptor),
    )?;
    let exports = [
        (
            "driver pool",
            IpcAllocation::from_driver_pool(&driver, 64 * MIB, s)?,
        ),
        ("VMM pool", IpcAllocation::from_vmm_pool(&vmm, 6 * MIB, s)?),
    ];

    let path = std::env::temp_dir().join(format!("rmm-example-ipc-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let mut child = Command::new(std::env::current_exe()?)
        .env(SOCKET, &path)
        .spawn()?;
    let (stream, _) = listener.accept()?;
    let _ = std::fs::remove_file(&path);
    let mut exporter = IpcExporter::new(IpcChannel::from(stream));

    for (name, allocation) in exports {
        let bytes = allocation.size();
        fill(allocation.ptr(), bytes, PARENT)?;
        println!("parent: exporting {} MiB of the {name}", bytes / MIB);
        let id = exporter.export(allocation, s)?;
        match exporter.wait_released(id)? {
            Released::ByImporter(a) => {
                let ok = all_equal(a.ptr(), bytes, CHILD)?;
                println!(
                    "parent: the child released it; its bytes {}",
                    if ok { "read back" } else { "WRONG" }
                );
            }
            Released::PeerGone(_) => println!("parent: the child died holding it"),
        }
    }
    drop(exporter);
    let status = child.wait()?;
    println!("rmm example ipc: done (child {status})");
    Ok(())
}
