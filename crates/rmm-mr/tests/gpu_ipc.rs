//! GPU tests of IPC (`rmm_mr::ipc`): the binary spawns itself as the importing process
//! (`RMM_IPC_CHILD` selects the child's role), the parent allocates and fills, the child imports,
//! checks and writes back, and the parent checks what it wrote; from a driver pool and from a
//! VMM pool, on one device and with the child on a second device (ignored with the reason on
//! one); and a child that dies holding an import, after which the parent's pool still
//! allocates, frees and holds nothing. Without a GPU every trial reports itself ignored.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed};
use rmm_mr::{
    CudaAsyncMemoryResource, CudaAsyncOptions, DeviceMemoryResource, IpcAllocation, IpcChannel,
    IpcExporter, IpcImporter, Released, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::CudaStreamView;
use rmm_sys::testing::{ensure, gpu_if, no_pools, no_vmm};
use rmm_sys::{memory, AllocationHandleType, DeviceId, DevicePtr};

const MIB: usize = 1 << 20;
/// What the parent writes, and what the child writes back.
const PARENT_WORD: u32 = 0xA5A5_0001;
const CHILD_WORD: u32 = 0x5A5A_0002;

const ENV_ROLE: &str = "RMM_IPC_CHILD";
const ENV_SOCKET: &str = "RMM_IPC_SOCKET";
const ENV_DEVICE: &str = "RMM_IPC_DEVICE";

fn fail(e: impl std::fmt::Display) -> Failed {
    e.to_string().into()
}

fn fill(ptr: DevicePtr, bytes: usize, word: u32) -> Result<(), Failed> {
    let s = CudaStreamView::default();
    // SAFETY: `ptr` holds `bytes` bytes owned by the caller for the call, which waits.
    unsafe { memory::memset_d32_async(ptr, word, bytes / 4, s.as_raw()) }.map_err(fail)?;
    s.synchronize().map_err(fail)
}

/// Whether every word of `[ptr, ptr + bytes)` is `word` (the first mismatch otherwise).
fn check(ptr: DevicePtr, bytes: usize, word: u32) -> Result<(), String> {
    let mut host = vec![0u8; bytes];
    // SAFETY: `ptr` holds `bytes` readable bytes for the call, which waits.
    unsafe { memory::copy_to_host_sync(&mut host, ptr, CudaStreamView::default().as_raw()) }
        .map_err(|e| e.to_string())?;
    match host
        .chunks_exact(4)
        .position(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) != word)
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "word {i} is {:#x}, expected {word:#x}",
            u32::from_le_bytes(host[4 * i..4 * i + 4].try_into().unwrap_or([0; 4]))
        )),
    }
}

// ---- The child -------------------------------------------------------------------------------

/// The importing process: imports one allocation, checks the parent's words, and (role
/// `check`) writes its own and releases, or (role `die`) aborts holding the import.
fn child(role: &str) -> i32 {
    let run = || -> Result<(), String> {
        let path = std::env::var(ENV_SOCKET).map_err(|e| e.to_string())?;
        let device = std::env::var(ENV_DEVICE)
            .ok()
            .and_then(|d| d.parse().ok())
            .map_or(DeviceId(0), DeviceId);
        rmm_sys::set_current_device(device).map_err(|e| e.to_string())?;
        let channel = IpcChannel::connect(&path).map_err(|e| e.to_string())?;
        let importer = IpcImporter::with_access(channel, &[device]).map_err(|e| e.to_string())?;
        let import = importer.receive().map_err(|e| e.to_string())?;
        check(import.ptr(), import.size(), PARENT_WORD)
            .map_err(|e| format!("the child read the parent's words: {e}"))?;
        if role == "die" {
            // Dies mid-way: no release, the import still mapped.
            std::process::abort();
        }
        fill(import.ptr(), import.size(), CHILD_WORD).map_err(|e| format!("{e:?}"))?;
        drop(import);
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ipc child ({role}): {e}");
            1
        }
    }
}

// ---- The parent ------------------------------------------------------------------------------

/// A listening socket and a spawned child connected to it.
struct Session {
    child: Child,
    path: PathBuf,
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Spawns this binary as the child in `role` on `device` and accepts its connection.
fn spawn(role: &str, device: DeviceId) -> Result<(Session, IpcExporter), Failed> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("rmm-ipc-{}-{n}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(fail)?;
    listener.set_nonblocking(true).map_err(fail)?;
    let exe = std::env::current_exe().map_err(fail)?;
    let child = Command::new(exe)
        .env(ENV_ROLE, role)
        .env(ENV_SOCKET, &path)
        .env(ENV_DEVICE, device.0.to_string())
        .spawn()
        .map_err(fail)?;
    let mut session = Session { child, path };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(fail)?;
                return Ok((session, IpcExporter::new(IpcChannel::from(stream))));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(Some(status)) = session.child.try_wait() {
                    return Err(format!("the child exited before connecting: {status}").into());
                }
                if Instant::now() > deadline {
                    return Err("the child did not connect within 120 s".into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(fail(e)),
        }
    }
}

/// The round trip: fill, export, let the child check and write back, check its words.
fn round_trip(allocation: IpcAllocation, child_device: DeviceId) -> Result<(), Failed> {
    let bytes = allocation.size();
    fill(allocation.ptr(), bytes, PARENT_WORD)?;
    let (mut session, mut exporter) = spawn("check", child_device)?;
    let id = exporter
        .export(allocation, CudaStreamView::default())
        .map_err(fail)?;
    ensure(exporter.outstanding() == 1, "one export outstanding")?;
    let back = exporter.wait_released(id).map_err(fail)?;
    let status = session.child.wait().map_err(fail)?;
    ensure(status.success(), format!("the child failed: {status}"))?;
    let Released::ByImporter(allocation) = back else {
        return Err("the child went away without releasing".into());
    };
    check(allocation.ptr(), bytes, CHILD_WORD)
        .map_err(|e| format!("the parent read the child's words: {e}"))?;
    ensure(exporter.outstanding() == 0, "nothing outstanding")?;
    Ok(())
}

fn driver_pool() -> Result<CudaAsyncMemoryResource, Failed> {
    CudaAsyncMemoryResource::with_options(
        CudaAsyncOptions::default().export_handle_type(AllocationHandleType::PosixFileDescriptor),
    )
    .map_err(fail)
}

fn vmm_pool() -> Result<VmmPoolMemoryResource, Failed> {
    VmmPoolMemoryResource::with_options(
        VmmPoolOptions::new(256 * MIB)
            .granularity(2 * MIB)
            .export_handle_type(AllocationHandleType::PosixFileDescriptor),
    )
    .map_err(fail)
}

/// A VMM allocation that spans two chunks: 1 MiB first, then 3 MiB from 1 MiB on.
fn vmm_allocation(pool: &VmmPoolMemoryResource) -> Result<(IpcAllocation, IpcAllocation), Failed> {
    let s = CudaStreamView::default();
    let head = IpcAllocation::from_vmm_pool(pool, MIB, s).map_err(fail)?;
    let spanning = IpcAllocation::from_vmm_pool(pool, 3 * MIB, s).map_err(fail)?;
    ensure(
        pool.chunk_count() >= 2,
        format!("{} chunk(s)", pool.chunk_count()),
    )?;
    Ok((head, spanning))
}

fn driver_pool_round_trip(child_device: DeviceId) -> Result<(), Failed> {
    rmm_sys::set_current_device(DeviceId(0)).map_err(fail)?;
    let pool = driver_pool()?;
    let a =
        IpcAllocation::from_driver_pool(&pool, 8 * MIB, CudaStreamView::default()).map_err(fail)?;
    round_trip(a, child_device)?;
    CudaStreamView::default().synchronize().map_err(fail)?;
    let used = pool.statistics().map_err(fail)?.used_current;
    ensure(used == 0, format!("{used} bytes still used after the free"))
}

fn vmm_pool_round_trip(child_device: DeviceId) -> Result<(), Failed> {
    rmm_sys::set_current_device(DeviceId(0)).map_err(fail)?;
    let pool = vmm_pool()?;
    let (head, spanning) = vmm_allocation(&pool)?;
    round_trip(spanning, child_device)?;
    drop(head);
    ensure(
        pool.outstanding_allocations() == 0,
        format!("{} allocations outstanding", pool.outstanding_allocations()),
    )
}

/// Exports `allocation` to a child that aborts holding the import: the allocation comes back
/// as orphaned once the child is gone, and is freed here.
fn orphan(allocation: IpcAllocation) -> Result<(), Failed> {
    let s = CudaStreamView::default();
    fill(allocation.ptr(), allocation.size(), PARENT_WORD)?;
    let (mut session, mut exporter) = spawn("die", DeviceId(0))?;
    let id = exporter.export(allocation, s).map_err(fail)?;
    let back = exporter.wait_released(id).map_err(fail)?;
    let status = session.child.wait().map_err(fail)?;
    ensure(
        !status.success(),
        format!("the child should have died: {status}"),
    )?;
    ensure(back.peer_gone(), "the export came back as orphaned")?;
    drop(back);
    drop(exporter);
    s.synchronize().map_err(fail)
}

/// A child dies holding an import of a driver-pool allocation: the pool still allocates and
/// frees, and uses nothing afterwards.
fn dead_child_driver_pool() -> Result<(), Failed> {
    rmm_sys::set_current_device(DeviceId(0)).map_err(fail)?;
    let s = CudaStreamView::default();
    let pool = driver_pool()?;
    orphan(IpcAllocation::from_driver_pool(&pool, 4 * MIB, s).map_err(fail)?)?;
    let x = IpcAllocation::from_driver_pool(&pool, 16 * MIB, s).map_err(fail)?;
    fill(x.ptr(), 16 * MIB, 7)?;
    drop(x);
    s.synchronize().map_err(fail)?;
    let used = pool.statistics().map_err(fail)?.used_current;
    ensure(used == 0, format!("{used} bytes still used"))
}

/// The same with a VMM-pool allocation that spans two chunks.
fn dead_child_vmm_pool() -> Result<(), Failed> {
    rmm_sys::set_current_device(DeviceId(0)).map_err(fail)?;
    let s = CudaStreamView::default();
    let pool = vmm_pool()?;
    let (head, spanning) = vmm_allocation(&pool)?;
    orphan(spanning)?;
    drop(head);
    let x = pool.allocate(s, 16 * MIB, 256).map_err(fail)?;
    fill(x, 16 * MIB, 7)?;
    // SAFETY: allocated above with this size on `s`, which the fill synchronized.
    unsafe { pool.deallocate(s, x, 16 * MIB, 256) }.map_err(fail)?;
    ensure(
        pool.outstanding_allocations() == 0,
        format!("{} allocations outstanding", pool.outstanding_allocations()),
    )
}

// ---- What a trial needs ----------------------------------------------------------------------

fn no_fd_pools() -> Option<String> {
    no_pools().or_else(|| match rmm_sys::testing::caps() {
        Ok(c) if c.supports_handle_type(AllocationHandleType::PosixFileDescriptor) => None,
        Ok(_) => Some("the device's pools cannot export POSIX file descriptors".into()),
        Err(e) => Some(format!("{e:?}")),
    })
}

fn no_fd_vmm() -> Option<String> {
    no_vmm().or_else(|| match rmm_sys::vmm::posix_fd_supported(DeviceId(0)) {
        Ok(true) => None,
        Ok(false) => Some("the device cannot export POSIX file descriptors".into()),
        Err(e) => Some(e.to_string()),
    })
}

fn no_peer() -> Option<String> {
    match rmm_sys::device_count() {
        Ok(n) if n >= 2 => match rmm_sys::ipc::can_access_peer(DeviceId(1), DeviceId(0)) {
            Ok(true) => None,
            Ok(false) => Some("device 1 cannot access device 0 (no peer access)".into()),
            Err(e) => Some(e.to_string()),
        },
        Ok(n) => Some(format!("needs two devices, found {n}")),
        Err(e) => Some(e.to_string()),
    }
}

fn main() {
    if let Ok(role) = std::env::var(ENV_ROLE) {
        std::process::exit(child(&role));
    }
    let args = Arguments::from_args();
    let trials = vec![
        gpu_if("ipc/driver_pool/one_gpu", no_fd_pools, || {
            driver_pool_round_trip(DeviceId(0))
        }),
        gpu_if(
            "ipc/driver_pool/two_gpus",
            || no_fd_pools().or_else(no_peer),
            || driver_pool_round_trip(DeviceId(1)),
        ),
        gpu_if("ipc/vmm_pool/one_gpu", no_fd_vmm, || {
            vmm_pool_round_trip(DeviceId(0))
        }),
        gpu_if(
            "ipc/vmm_pool/two_gpus",
            || no_fd_vmm().or_else(no_peer),
            || vmm_pool_round_trip(DeviceId(1)),
        ),
        gpu_if(
            "ipc/driver_pool/dead_child",
            no_fd_pools,
            dead_child_driver_pool,
        ),
        gpu_if("ipc/vmm_pool/dead_child", no_fd_vmm, dead_child_vmm_pool),
    ];
    libtest_mimic::run(&args, trials).exit();
}
