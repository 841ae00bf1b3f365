//! A/B of the CUDA wrappers against the calls under them and RMM C++'s calls, in one process
//! (method and figures: `docs/perf-log/2026-11-26-wrap-ab.md`; what the two sides' calls are:
//! `docs/perf-log/2026-11-26-wrapper-differences.md`).
//!
//! ```text
//! wrap_ab [--reps N] [--async-reps N] [--ops N] [--sync a,b] [--async r64,a] [--only NAME,...]
//!         [--no-runtime | --runtime-first]
//! ```
//!
//! The peer comparison runs RMM C++ and rmm-rs in two processes, one after the other, so a
//! difference between them may be the calls or the process. Here every variant replays the
//! same trace (the peer plan's workloads, `rmm_benches::peer::standard_plan`, one thread) in
//! the same process, one pass per variant per round, in an order that changes every round
//! ([`rmm_benches::ab::round_order`]); each pass runs on a fresh thread, as the peer
//! comparison's passes do. The figure is the median of the rounds, ns per operation
//! (allocations and frees), and its ratio to the runtime's (RMM's) call and to the bare driver
//! call.
//!
//! `cuda` workloads (`--sync`, default `a,b`; `--reps`, default 9 rounds):
//!
//! - `rt-malloc`: `cudaMalloc` / `cudaFree` of the CUDA runtime (RMM's `cuda_memory_resource`);
//! - `drv-dlsym`: `cuMemAlloc_v2` / `cuMemFree_v2` looked up with `dlsym` in `libcuda` (what
//!   rmm-sys calls);
//! - `drv-procaddr`: the same entry points as `cuGetProcAddress` gives them (how the runtime
//!   finds them);
//! - `mr-cuda`: `CudaMemoryResource`, called directly;
//! - `mr-cuda-peer`: the peer comparison's `cuda` cell (`StatisticsResourceAdaptor` over
//!   `CudaMemoryResource` behind an `Arc<dyn DeviceMemoryResource>`, `rmm_benches::replay`).
//!
//! `async` workloads (`--async`, default `r64,a`; `--async-reps`, default 31 rounds), each
//! variant on a pool and a non-blocking stream of its own, release threshold `u64::MAX`:
//!
//! - `rt-calls-rt-pool`: RMM's `cuda_async_memory_resource`: a pool from `cudaMemPoolCreate`
//!   with RMM's properties (usage `HW_DECOMPRESS` from CUDA 12.8), `cudaMallocFromPoolAsync` /
//!   `cudaFreeAsync`, a stream from `cudaStreamCreateWithFlags`;
//! - `drv-calls-rt-pool`: `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` (dlsym) on a pool from
//!   `cudaMemPoolCreate` with RMM's properties;
//! - `drv-calls-pool-rmm-usage`: the driver's calls on a pool from rmm-sys's
//!   `mem_pool_create_with_usage` with RMM's usage (what `CudaAsyncMemoryResource` makes now);
//! - `drv-calls-pool-usage0`: the same on a pool of usage 0 (what it made before);
//! - `mr-async`: `CudaAsyncMemoryResource`, called directly;
//! - `mr-async-peer`: the peer comparison's `async` cell (behind an `Arc<dyn ...>`).
//!
//! The runtime (`libcudart`) is loaded at run time: `$WRAP_AB_CUDART` if set, else
//! `libcudart.so.13`, `.12`, `libcudart.so`, then the toolkit's folders (`/usr/local/cuda*/`);
//! without one the runtime variants are skipped (`--no-runtime` skips them on purpose, to see
//! whether loading the runtime changes the driver variants; `--runtime-first` lets the runtime
//! make the primary context, as in RMM's process). `--only` keeps the variants
//! named (to run one of them alone in a process). Each pool's attributes are printed, read
//! back from the driver.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use libloading::Library;
use rmm_benches::ab::{round_order, table, Row};
use rmm_benches::args::Args;
use rmm_benches::gpu::describe_device;
use rmm_benches::peer::{standard_plan, PlanOptions};
use rmm_benches::sizing::DeviceMemory;
use rmm_benches::{Op, Trace};
use rmm_mr::{
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, SharedResource,
    StatisticsResourceAdaptor,
};
use rmm_stream::CudaStream;
use rmm_sys::mempool::{self, MemPoolAttribute, MemPoolUsage};
use rmm_sys::{AllocationHandleType, DeviceId};

type Error = Box<dyn std::error::Error>;

/// `CUresult` / `cudaError_t`, read as integers (0: success).
type Code = u32;
type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> Code;
type FreeFn = unsafe extern "C" fn(u64) -> Code;
type PoolAllocFn = unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> Code;
type FreeAsyncFn = unsafe extern "C" fn(u64, *mut c_void) -> Code;
type SyncFn = unsafe extern "C" fn(*mut c_void) -> Code;
type PoolAttrFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> Code;
type PoolCreateFn = unsafe extern "C" fn(*mut *mut c_void, *const PoolProps) -> Code;
type PoolDestroyFn = unsafe extern "C" fn(*mut c_void) -> Code;
type IntFn = unsafe extern "C" fn(c_int) -> Code;
type IntOutFn = unsafe extern "C" fn(*mut c_int) -> Code;
type StreamCreateFn = unsafe extern "C" fn(*mut *mut c_void, u32) -> Code;
type PrimaryStateFn = unsafe extern "C" fn(c_int, *mut u32, *mut c_int) -> Code;
type GetProcFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut u32) -> Code;

/// `CUmemPoolProps` / `cudaMemPoolProps` (88 bytes, the same layout since CUDA 11.2).
#[repr(C)]
struct PoolProps {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
    win32: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

const _: () = assert!(std::mem::size_of::<PoolProps>() == 88);

impl PoolProps {
    /// RMM's `cuda_async_memory_resource_impl`: pinned, no export handle, the device, and
    /// `usage` (`HW_DECOMPRESS`, 0x2, where the driver is 12.8 or newer).
    fn rmm(device: i32, usage: u16) -> Self {
        Self {
            alloc_type: 1,
            handle_types: 0,
            location_type: 1,
            location_id: device,
            win32: std::ptr::null_mut(),
            max_size: 0,
            usage,
            reserved: [0; 54],
        }
    }
}

/// Copies a function pointer of type `F` out of `lib`.
///
/// # Safety
/// `F` is the type of `name` in `lib`, and the copy is not called after `lib` is unloaded.
unsafe fn sym<F: Copy>(lib: &Library, name: &str) -> Result<F, Error> {
    // SAFETY: the caller's contract.
    let s = unsafe { lib.get::<F>(name.as_bytes()) }.map_err(|e| format!("{name}: {e}"))?;
    Ok(*s)
}

fn ok(call: &str, code: Code) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{call} failed with code {code}"))
    }
}

/// The driver entry points called directly (looked up in `libcuda` with `dlsym`).
struct Driver {
    _lib: Library,
    alloc: AllocFn,
    free: FreeFn,
    pool_alloc: PoolAllocFn,
    free_async: FreeAsyncFn,
    stream_sync: SyncFn,
    pool_get: PoolAttrFn,
    get_proc: GetProcFn,
    primary_state: PrimaryStateFn,
}

impl Driver {
    fn load() -> Result<Self, Error> {
        // SAFETY: loading the driver library (rmm-sys already did, so this is its handle).
        let lib = unsafe { Library::new("libcuda.so.1") }?;
        // SAFETY: each type is the entry point's signature in `cuda.h`; `_lib` keeps the
        // library loaded as long as the pointers.
        unsafe {
            Ok(Self {
                alloc: sym(&lib, "cuMemAlloc_v2")?,
                free: sym(&lib, "cuMemFree_v2")?,
                pool_alloc: sym(&lib, "cuMemAllocFromPoolAsync")?,
                free_async: sym(&lib, "cuMemFreeAsync")?,
                stream_sync: sym(&lib, "cuStreamSynchronize")?,
                pool_get: sym(&lib, "cuMemPoolGetAttribute")?,
                get_proc: sym(&lib, "cuGetProcAddress_v2")?,
                primary_state: sym(&lib, "cuDevicePrimaryCtxGetState")?,
                _lib: lib,
            })
        }
    }

    /// `cuMemAlloc` and `cuMemFree` as `cuGetProcAddress` returns them for `version`.
    fn by_proc_address(&self, version: i32) -> Result<(AllocFn, FreeFn), Error> {
        let get = |name: &CStr| -> Result<*mut c_void, Error> {
            let mut p: *mut c_void = std::ptr::null_mut();
            let mut status = 0u32;
            // SAFETY: the driver is initialized; NUL-terminated name; writes a pointer and a
            // status.
            let r = unsafe { (self.get_proc)(name.as_ptr(), &mut p, version, 0, &mut status) };
            if r != 0 || status != 0 || p.is_null() {
                return Err(format!("cuGetProcAddress({name:?}): {r}, status {status}").into());
            }
            Ok(p)
        };
        let a = get(c"cuMemAlloc")?;
        let f = get(c"cuMemFree")?;
        // SAFETY: `cuMemAlloc` and `cuMemFree` at `version` (12.0 and later: the `_v2` ABIs).
        Ok(unsafe {
            (
                std::mem::transmute::<*mut c_void, AllocFn>(a),
                std::mem::transmute::<*mut c_void, FreeFn>(f),
            )
        })
    }

    /// The flags and state of `device`'s primary context (`cuDevicePrimaryCtxGetState`).
    fn primary_state(&self, device: i32) -> String {
        let (mut flags, mut active) = (0u32, 0 as c_int);
        // SAFETY: the driver is initialized; writes the flags and the state.
        let r = unsafe { (self.primary_state)(device, &mut flags, &mut active) };
        if r == 0 {
            format!("flags {flags:#x}, active {active}")
        } else {
            format!("cuDevicePrimaryCtxGetState failed with code {r}")
        }
    }

    /// A pool's reuse flags, release threshold and reserved high watermark.
    fn describe_pool(&self, pool: usize) -> String {
        let int = |attr: c_int| {
            let mut v: c_int = -1;
            // SAFETY: a live pool; the attribute is an int.
            let r = unsafe {
                (self.pool_get)(pool as *mut c_void, attr, (&mut v as *mut c_int).cast())
            };
            if r == 0 {
                v.to_string()
            } else {
                format!("error {r}")
            }
        };
        let u64_ = |attr: c_int| {
            let mut v: u64 = 0;
            // SAFETY: a live pool; the attribute is a cuuint64_t.
            let r =
                unsafe { (self.pool_get)(pool as *mut c_void, attr, (&mut v as *mut u64).cast()) };
            if r == 0 {
                format!("{v:#x}")
            } else {
                format!("error {r}")
            }
        };
        format!(
            "reuse follow-events {}, opportunistic {}, internal-deps {}; release threshold {}; reserved high {}; hw-decompress enabled (13.2+) {}",
            int(1),
            int(2),
            int(3),
            u64_(4),
            u64_(6),
            int(14)
        )
    }
}

/// The CUDA runtime's entry points (`libcudart`, loaded at run time).
struct Runtime {
    _lib: Library,
    path: String,
    version: i32,
    malloc: AllocFn,
    free: FreeFn,
    set_device: IntFn,
    pool_create: PoolCreateFn,
    pool_set: PoolAttrFn,
    pool_destroy: PoolDestroyFn,
    pool_alloc: PoolAllocFn,
    free_async: FreeAsyncFn,
    stream_create: StreamCreateFn,
    stream_sync: SyncFn,
    stream_destroy: SyncFn,
}

impl Runtime {
    fn candidates() -> Vec<PathBuf> {
        let mut c: Vec<PathBuf> = std::env::var_os("WRAP_AB_CUDART")
            .map(PathBuf::from)
            .into_iter()
            .collect();
        c.extend(["libcudart.so.13", "libcudart.so.12", "libcudart.so"].map(PathBuf::from));
        let mut dirs = vec![
            PathBuf::from("/usr/local/cuda/lib64"),
            PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"),
        ];
        if let Ok(entries) = std::fs::read_dir("/usr/local") {
            let mut more: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("cuda-"))
                })
                .flat_map(|p| [p.join("lib64"), p.join("targets/x86_64-linux/lib")])
                .collect();
            more.sort();
            dirs.extend(more.into_iter().rev());
        }
        for d in dirs {
            if let Ok(entries) = std::fs::read_dir(&d) {
                let mut libs: Vec<PathBuf> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("libcudart.so"))
                    })
                    .collect();
                libs.sort();
                c.extend(libs);
            }
        }
        c
    }

    fn load() -> Result<Self, String> {
        let mut tried = Vec::new();
        for path in Self::candidates() {
            // SAFETY: loading the CUDA runtime runs its initializers, which have no
            // preconditions.
            match unsafe { Library::new(&path) } {
                Ok(lib) => {
                    return Self::from(lib, path.display().to_string()).map_err(|e| e.to_string())
                }
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(format!("no libcudart found (tried {})", tried.join("; ")))
    }

    fn from(lib: Library, path: String) -> Result<Self, Error> {
        // SAFETY: each type is the function's signature in `cuda_runtime_api.h`; `_lib` keeps
        // the library loaded as long as the pointers.
        let mut rt = unsafe {
            Self {
                path,
                version: 0,
                malloc: sym(&lib, "cudaMalloc")?,
                free: sym(&lib, "cudaFree")?,
                set_device: sym(&lib, "cudaSetDevice")?,
                pool_create: sym(&lib, "cudaMemPoolCreate")?,
                pool_set: sym(&lib, "cudaMemPoolSetAttribute")?,
                pool_destroy: sym(&lib, "cudaMemPoolDestroy")?,
                pool_alloc: sym(&lib, "cudaMallocFromPoolAsync")?,
                free_async: sym(&lib, "cudaFreeAsync")?,
                stream_create: sym(&lib, "cudaStreamCreateWithFlags")?,
                stream_sync: sym(&lib, "cudaStreamSynchronize")?,
                stream_destroy: sym(&lib, "cudaStreamDestroy")?,
                _lib: lib,
            }
        };
        // SAFETY: `cudaRuntimeGetVersion(int*)`.
        let get_version: IntOutFn = unsafe { sym(&rt._lib, "cudaRuntimeGetVersion")? };
        // SAFETY: writes one int.
        ok("cudaRuntimeGetVersion", unsafe {
            get_version(&mut rt.version)
        })?;
        Ok(rt)
    }

    /// RMM's pool: `cudaMemPoolCreate` with RMM's properties, then the release threshold.
    fn rmm_pool(&self, device: i32, usage: u16) -> Result<usize, String> {
        let props = PoolProps::rmm(device, usage);
        let mut pool: *mut c_void = std::ptr::null_mut();
        // SAFETY: `props` has the layout of `cudaMemPoolProps`; writes one handle.
        ok("cudaMemPoolCreate", unsafe {
            (self.pool_create)(&mut pool, &props)
        })?;
        let mut threshold = u64::MAX;
        // SAFETY: a live pool; the release threshold is a cuuint64_t.
        ok("cudaMemPoolSetAttribute", unsafe {
            (self.pool_set)(pool, 4, (&mut threshold as *mut u64).cast())
        })?;
        Ok(pool as usize)
    }

    /// A non-blocking stream made by the runtime.
    fn stream(&self) -> Result<usize, String> {
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one handle; 1 is `cudaStreamNonBlocking`.
        ok("cudaStreamCreateWithFlags", unsafe {
            (self.stream_create)(&mut s, 1)
        })?;
        Ok(s as usize)
    }
}

/// Replays `trace` through `alloc` / `free` on the calling thread and waits with `sync`; the
/// wall time. On a failure, frees what it holds and reports the operation.
fn replay_raw(
    trace: &Trace,
    mut alloc: impl FnMut(usize) -> Result<u64, String>,
    mut free: impl FnMut(u64) -> Result<(), String>,
    sync: impl FnOnce() -> Result<(), String>,
) -> Result<Duration, String> {
    let mut held = vec![0u64; trace.slots];
    let start = Instant::now();
    for (i, op) in trace.ops.iter().enumerate() {
        let step = match *op {
            // Zero bytes: no call (the resources answer null without one, and `cuMemAlloc`
            // refuses 0).
            Op::Alloc { size: 0, .. } => Ok(()),
            Op::Alloc { slot, size } => alloc(size).map(|p| held[slot as usize] = p),
            Op::Free { slot } => {
                let p = std::mem::take(&mut held[slot as usize]);
                if p == 0 {
                    Ok(())
                } else {
                    free(p)
                }
            }
        };
        if let Err(e) = step {
            for p in held.into_iter().filter(|&p| p != 0) {
                let _ = free(p);
            }
            return Err(format!("operation {i} ({op:?}): {e}"));
        }
    }
    sync()?;
    Ok(start.elapsed())
}

/// A pass of one variant over a trace.
type Pass<'a> = Box<dyn Fn(&Trace) -> Result<Duration, String> + Send + Sync + 'a>;

struct Variant<'a> {
    name: &'static str,
    calls: &'static str,
    pass: Pass<'a>,
}

impl<'a> Variant<'a> {
    fn new(
        name: &'static str,
        calls: &'static str,
        pass: impl Fn(&Trace) -> Result<Duration, String> + Send + Sync + 'a,
    ) -> Self {
        Self {
            name,
            calls,
            pass: Box::new(pass),
        }
    }
}

/// What the variants of one kind need to live as long as they run.
struct Held {
    /// Five non-blocking streams made by rmm-stream.
    streams: Vec<CudaStream>,
    /// A non-blocking stream made by the runtime (0 without one).
    rt_stream: usize,
    /// Two pools from `cudaMemPoolCreate` (none without the runtime).
    rt_pools: Vec<usize>,
    /// Two pools from `mem_pool_create_with_usage`: RMM's usage, then usage 0.
    our_pools: Vec<rmm_sys::MemPoolHandle>,
}

/// An entry point and its name (for errors).
type Named<F> = (&'static str, F);

/// The pointer `call` writes, or the error of the call `name`.
fn written(name: &str, call: impl FnOnce(&mut u64) -> Code) -> Result<u64, String> {
    let mut p = 0u64;
    ok(name, call(&mut p)).map(|()| p)
}

/// A variant that replays through raw calls: `alloc(bytes)` returns the pointer, `free(p)`
/// frees it, `sync()` waits for the stream.
fn raw_variant<'a>(
    name: &'static str,
    calls: &'static str,
    alloc: impl Fn(usize) -> Result<u64, String> + Send + Sync + 'a,
    free: impl Fn(u64) -> Result<(), String> + Send + Sync + 'a,
    sync: impl Fn() -> Result<(), String> + Send + Sync + 'a,
) -> Variant<'a> {
    Variant::new(name, calls, move |t| replay_raw(t, &alloc, &free, &sync))
}

/// A variant of synchronous calls: `cudaMalloc` / `cudaFree` or `cuMemAlloc` / `cuMemFree`
/// (the same signatures), waiting with `sync`.
fn malloc_variant<'a>(
    name: &'static str,
    calls: &'static str,
    (alloc_name, alloc): Named<AllocFn>,
    (free_name, free): Named<FreeFn>,
    sync: impl Fn() -> Result<(), String> + Send + Sync + 'a,
) -> Variant<'a> {
    raw_variant(
        name,
        calls,
        // SAFETY: a context is current (the pass thread's, the runtime's device set where it
        // is loaded); writes one pointer.
        move |n| written(alloc_name, |p| unsafe { alloc(p, n) }),
        // SAFETY: `p` came from the matching allocation call and is freed once.
        move |p| ok(free_name, unsafe { free(p) }),
        sync,
    )
}

/// A variant of stream-ordered calls on `pool` and the stream `s`: the runtime's
/// `cudaMallocFromPoolAsync` / `cudaFreeAsync` / `cudaStreamSynchronize` or the driver's
/// `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` / `cuStreamSynchronize` (the same signatures).
fn pool_variant<'a>(
    name: &'static str,
    calls: &'static str,
    (alloc_name, alloc): Named<PoolAllocFn>,
    (free_name, free): Named<FreeAsyncFn>,
    (sync_name, sync): Named<SyncFn>,
    (pool, s): (usize, usize),
) -> Variant<'a> {
    raw_variant(
        name,
        calls,
        move |n| {
            // SAFETY: a live pool and stream; writes one pointer.
            written(alloc_name, |p| unsafe {
                alloc(p, n, pool as *mut c_void, s as *mut c_void)
            })
        },
        // SAFETY: `p` came from the pool on this stream and is freed once.
        move |p| ok(free_name, unsafe { free(p, s as *mut c_void) }),
        // SAFETY: a live stream.
        move || ok(sync_name, unsafe { sync(s as *mut c_void) }),
    )
}

/// A variant that replays through `mr` on `stream`, waiting with `sync`.
fn mr_variant<'a, R: DeviceMemoryResource>(
    name: &'static str,
    calls: &'static str,
    mr: R,
    stream: &'a CudaStream,
    sync: impl Fn() -> Result<(), String> + Send + Sync + 'a,
) -> Variant<'a> {
    Variant::new(name, calls, move |t| {
        let view = stream.view();
        replay_raw(
            t,
            |n| {
                mr.allocate(view, n, 256)
                    .map(|p| p.addr())
                    .map_err(|e| e.to_string())
            },
            |p| {
                // SAFETY: `p` came from `mr` on this stream and is freed once (the size is not
                // used).
                unsafe { mr.deallocate(view, rmm_sys::DevicePtr::from_raw(p), 0, 256) }
                    .map_err(|e| e.to_string())
            },
            &sync,
        )
    })
}

/// The peer comparison's cell: `peer` replayed by `rmm_benches::replay` on `stream`.
fn peer_variant<'a>(
    name: &'static str,
    calls: &'static str,
    peer: SharedResource,
    stream: &'a CudaStream,
) -> Variant<'a> {
    Variant::new(name, calls, move |t| {
        rmm_benches::replay(&*peer, stream, t).map_err(|e| e.to_string())
    })
}

fn sync_variants<'a>(
    drv: &'a Driver,
    rt: Option<&'a Runtime>,
    stream: &'a CudaStream,
    version: i32,
) -> Result<Vec<Variant<'a>>, Error> {
    let s = stream.as_raw_addr();
    let sync = move || {
        // SAFETY: a live stream.
        ok("cuStreamSynchronize", unsafe {
            (drv.stream_sync)(s as *mut c_void)
        })
    };
    let mut v = Vec::new();
    if let Some(rt) = rt {
        v.push(malloc_variant(
            "rt-malloc",
            "cudaMalloc / cudaFree (RMM)",
            ("cudaMalloc", rt.malloc),
            ("cudaFree", rt.free),
            sync,
        ));
    }
    v.push(malloc_variant(
        "drv-dlsym",
        "cuMemAlloc_v2 / cuMemFree_v2 (dlsym)",
        ("cuMemAlloc", drv.alloc),
        ("cuMemFree", drv.free),
        sync,
    ));
    let (a, f) = drv.by_proc_address(version)?;
    v.push(malloc_variant(
        "drv-procaddr",
        "the same, from cuGetProcAddress",
        ("cuMemAlloc", a),
        ("cuMemFree", f),
        sync,
    ));
    v.push(mr_variant(
        "mr-cuda",
        "CudaMemoryResource (direct)",
        CudaMemoryResource::new(),
        stream,
        sync,
    ));
    v.push(peer_variant(
        "mr-cuda-peer",
        "the peer's cell: Arc<dyn> statistics over CudaMemoryResource",
        rmm_mr::shared(StatisticsResourceAdaptor::new(CudaMemoryResource::new())),
        stream,
    ));
    Ok(v)
}

fn async_variants<'a>(
    drv: &'a Driver,
    rt: Option<&'a Runtime>,
    held: &'a Held,
) -> Vec<Variant<'a>> {
    let mut v = Vec::new();
    let drv_calls = |name, calls, pool: usize, s: usize| {
        pool_variant(
            name,
            calls,
            ("cuMemAllocFromPoolAsync", drv.pool_alloc),
            ("cuMemFreeAsync", drv.free_async),
            ("cuStreamSynchronize", drv.stream_sync),
            (pool, s),
        )
    };
    // Streams: 0 drv-calls-rt-pool, 1 drv-calls-pool-rmm-usage, 2 drv-calls-pool-usage0,
    // 3 mr-async, 4 mr-async-peer. Pools from mem_pool_create_with_usage: 0 RMM's usage, 1
    // usage 0.
    let stream = |i: usize| held.streams[i].as_raw_addr();
    let ours = |i: usize| held.our_pools[i].as_raw() as usize;
    if let Some(rt) = rt {
        v.push(pool_variant(
            "rt-calls-rt-pool",
            "RMM: cudaMallocFromPoolAsync / cudaFreeAsync, cudaMemPoolCreate, runtime stream",
            ("cudaMallocFromPoolAsync", rt.pool_alloc),
            ("cudaFreeAsync", rt.free_async),
            ("cudaStreamSynchronize", rt.stream_sync),
            (held.rt_pools[0], held.rt_stream),
        ));
        v.push(drv_calls(
            "drv-calls-rt-pool",
            "cuMemAllocFromPoolAsync / cuMemFreeAsync, pool from cudaMemPoolCreate (RMM's)",
            held.rt_pools[1],
            stream(0),
        ));
    }
    v.push(drv_calls(
        "drv-calls-pool-rmm-usage",
        "driver calls, pool from mem_pool_create_with_usage, RMM's usage (rmm-rs now)",
        ours(0),
        stream(1),
    ));
    v.push(drv_calls(
        "drv-calls-pool-usage0",
        "driver calls, pool of usage 0 (rmm-rs before)",
        ours(1),
        stream(2),
    ));
    // A resource of its own for `name`, its pool's attributes printed (`None`, said, if it
    // cannot be made).
    let resource = |name: &str| match CudaAsyncMemoryResource::new() {
        Ok(mr) => {
            println!(
                "pool of {name}: {}",
                drv.describe_pool(mr.pool_handle().as_raw() as usize)
            );
            Some(mr)
        }
        Err(e) => {
            println!("{name}: skipped ({e})");
            None
        }
    };
    if let Some(mr) = resource("mr-async") {
        let stream = &held.streams[3];
        v.push(mr_variant(
            "mr-async",
            "CudaAsyncMemoryResource (direct)",
            mr,
            stream,
            move || stream.view().synchronize().map_err(|e| e.to_string()),
        ));
    }
    if let Some(mr) = resource("mr-async-peer") {
        v.push(peer_variant(
            "mr-async-peer",
            "the peer's cell: Arc<dyn> CudaAsyncMemoryResource",
            rmm_mr::shared(mr),
            &held.streams[4],
        ));
    }
    v
}

/// Raw handles of the streams, as addresses (so closures that hold them are `Send`).
trait RawAddr {
    fn as_raw_addr(&self) -> usize;
}

impl RawAddr for CudaStream {
    fn as_raw_addr(&self) -> usize {
        self.view().as_raw() as usize
    }
}

/// Runs `variants` over `trace`: one untimed pass each, then `rounds` rounds of one timed pass
/// each, in [`round_order`]; every pass on a fresh thread with the device's context current
/// (and the runtime's device set). The rows of the table.
fn rounds(
    variants: &[Variant<'_>],
    trace: &Trace,
    rounds: usize,
    device: DeviceId,
    rt: Option<&Runtime>,
) -> Result<Vec<Row>, Error> {
    let ops = trace.ops.len().max(1) as f64;
    let one = |v: &Variant<'_>| -> Result<f64, String> {
        std::thread::scope(|s| {
            s.spawn(|| {
                rmm_sys::set_current_device(device).map_err(|e| e.to_string())?;
                if let Some(rt) = rt {
                    // SAFETY: `cudaSetDevice(int)`.
                    ok("cudaSetDevice", unsafe { (rt.set_device)(device.0) })?;
                }
                (v.pass)(trace).map(|d| d.as_nanos() as f64 / ops)
            })
            .join()
            .unwrap_or_else(|_| Err("the pass panicked".into()))
        })
        .map_err(|e| format!("{}: {e}", v.name))
    };
    for v in variants {
        one(v)?;
    }
    let mut samples = vec![Vec::with_capacity(rounds); variants.len()];
    for r in 0..rounds {
        for i in round_order(variants.len(), r) {
            samples[i].push(one(&variants[i])?);
        }
    }
    Ok(variants
        .iter()
        .zip(samples)
        .map(|(v, samples)| Row {
            name: v.name.into(),
            calls: v.calls.into(),
            samples,
        })
        .collect())
}

fn main() -> ExitCode {
    let args = Args::from_env();
    // `--runtime-first`: the runtime makes the primary context (`cudaFree(0)`), as in RMM's
    // process, before rmm-sys touches the driver.
    let early = if args.has("--runtime-first") && !args.has("--no-runtime") {
        match Runtime::load().and_then(|rt| {
            // SAFETY: `cudaSetDevice(int)`.
            ok("cudaSetDevice", unsafe { (rt.set_device)(0) })?;
            // SAFETY: `cudaFree(0)`: frees nothing, makes the context.
            ok("cudaFree(0)", unsafe { (rt.free)(0) })?;
            Ok(rt)
        }) {
            Ok(rt) => Some(rt),
            Err(e) => {
                eprintln!("wrap_ab: --runtime-first: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    if let Some(why) = rmm_sys::gpu_unavailable_reason() {
        eprintln!("wrap_ab: needs a CUDA GPU: {why}");
        return ExitCode::FAILURE;
    }
    match run(&args, early) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wrap_ab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn names(args: &Args, flag: &str, default: &str) -> Vec<String> {
    args.value(flag)
        .unwrap_or(default)
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn run(args: &Args, early: Option<Runtime>) -> Result<(), Error> {
    let reps = args.usize_or("--reps", 9)?.max(1);
    let async_reps = args.usize_or("--async-reps", 31)?.max(1);
    let ops = args.usize_or("--ops", PlanOptions::default().ops)?.max(100);
    let only = args.value("--only").map(|v| names(args, "--only", v));
    let device = rmm_sys::current_device()?;
    let version = rmm_sys::driver_version()?.0;
    println!("# wrap_ab: {}", describe_device()?);
    println!(
        "# rmm-sys fault hook in driver calls: {}",
        if cfg!(feature = "driver-hooks") {
            "compiled in (feature `driver-hooks`: build with --no-default-features)"
        } else {
            "none"
        }
    );
    let drv = Driver::load()?;
    let rt = if args.has("--no-runtime") {
        println!("# runtime: not loaded (--no-runtime)");
        None
    } else {
        match early.map_or_else(Runtime::load, Ok) {
            Ok(rt) => {
                println!(
                    "# runtime: {} (CUDA {}.{}){}",
                    rt.path,
                    rt.version / 1000,
                    rt.version % 1000 / 10,
                    if args.has("--runtime-first") {
                        "; it made the primary context (--runtime-first)"
                    } else {
                        "; loaded after rmm-sys made the primary context"
                    }
                );
                // SAFETY: `cudaSetDevice(int)`: initializes the runtime on the device's primary
                // context, the one rmm-sys uses.
                ok("cudaSetDevice", unsafe { (rt.set_device)(device.0) })?;
                Some(rt)
            }
            Err(e) => {
                println!("# runtime: skipped ({e})");
                None
            }
        }
    };
    println!("# primary context: {}", drv.primary_state(device.0));
    let mem = DeviceMemory::query()?;
    let plan = standard_plan(
        &PlanOptions {
            ops,
            ..PlanOptions::default()
        },
        &mem,
    );
    let workload = |name: &str| -> Result<&Trace, Error> {
        plan.workloads
            .iter()
            .find(|w| w.name == name)
            .map(|w| &w.trace)
            .ok_or_else(|| format!("no workload `{name}` (a, b, r1, r64)").into())
    };
    let keep = |v: &Variant<'_>| {
        only.as_ref()
            .is_none_or(|o: &Vec<String>| o.iter().any(|n| n == v.name))
    };
    println!(
        "# {ops} operations per pass, one thread; `cuda`: {reps} rounds, `async`: {async_reps} rounds; ns per operation\n"
    );

    let stream = CudaStream::non_blocking()?;
    let sync_list: Vec<Variant<'_>> = sync_variants(&drv, rt.as_ref(), &stream, version)?
        .into_iter()
        .filter(keep)
        .collect();
    for name in names(args, "--sync", "a,b") {
        let trace = workload(&name)?;
        let rows = rounds(&sync_list, trace, reps, device, rt.as_ref())?;
        println!(
            "## cuda, workload {name} ({} operations)\n",
            trace.ops.len()
        );
        let first = if rt.is_some() {
            "rt-malloc"
        } else {
            "drv-dlsym"
        };
        println!("{}", table(&rows, first, Some("drv-dlsym")));
    }
    drop(sync_list);

    let async_names = names(args, "--async", "r64,a");
    // RMM's pool usage: hardware decompression from CUDA 12.8 (`hwdecompress::is_supported`).
    let rmm_usage = MemPoolUsage::rmm_default(rmm_sys::DriverVersion(version));
    let rmm_usage_bits: u16 = if rmm_usage == MemPoolUsage::HwDecompress {
        0x2
    } else {
        0
    };
    println!("# RMM's pool usage on this driver: {rmm_usage:?} ({rmm_usage_bits:#x})");
    if async_names.is_empty() {
        return Ok(());
    }
    for name in &async_names {
        let trace = workload(name)?;
        let mut held = Held {
            streams: (0..5)
                .map(|_| CudaStream::non_blocking())
                .collect::<Result<_, _>>()?,
            rt_stream: 0,
            rt_pools: Vec::new(),
            our_pools: Vec::new(),
        };
        for usage in [rmm_usage, MemPoolUsage::Default] {
            let pool =
                mempool::mem_pool_create_with_usage(device, AllocationHandleType::None, usage)?;
            // SAFETY: the pool was just created and is live until destroyed below.
            unsafe {
                mempool::mem_pool_set_attribute(pool, MemPoolAttribute::ReleaseThreshold, u64::MAX)
            }?;
            held.our_pools.push(pool);
        }
        if let Some(rt) = &rt {
            for _ in 0..2 {
                held.rt_pools.push(rt.rmm_pool(device.0, rmm_usage_bits)?);
            }
            held.rt_stream = rt.stream()?;
        }
        for (i, p) in held.rt_pools.iter().enumerate() {
            println!("runtime pool {i}: {}", drv.describe_pool(*p));
        }
        for (i, p) in held.our_pools.iter().enumerate() {
            println!(
                "mem_pool_create_with_usage pool {i} ({}): {}",
                ["RMM's usage", "usage 0"][i],
                drv.describe_pool(p.as_raw() as usize)
            );
        }
        let list: Vec<Variant<'_>> = async_variants(&drv, rt.as_ref(), &held)
            .into_iter()
            .filter(keep)
            .collect();
        let rows = rounds(&list, trace, async_reps, device, rt.as_ref())?;
        println!(
            "\n## async, workload {name} ({} operations)\n",
            trace.ops.len()
        );
        // Without the runtime, the ratios are to the pool as rmm-rs made it before.
        let (first, second) = if rt.is_some() {
            ("rt-calls-rt-pool", "drv-calls-rt-pool")
        } else {
            ("drv-calls-pool-usage0", "drv-calls-pool-rmm-usage")
        };
        println!("{}", table(&rows, first, Some(second)));
        drop(list);
        if let Some(rt) = &rt {
            for p in held.rt_pools.drain(..) {
                // SAFETY: created above, no longer used (the variants are dropped).
                let _ = unsafe { (rt.pool_destroy)(p as *mut c_void) };
            }
            if held.rt_stream != 0 {
                // SAFETY: created above, idle (every pass synchronized it).
                let _ = unsafe { (rt.stream_destroy)(held.rt_stream as *mut c_void) };
            }
        }
        for p in held.our_pools.drain(..) {
            // SAFETY: created above, no longer used.
            let _ = unsafe { mempool::mem_pool_destroy(p) };
        }
    }
    Ok(())
}
