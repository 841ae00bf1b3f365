//! GPU tests of the C API, calling its `extern "C"` functions as a C program would. Without a
//! GPU every trial reports itself ignored, with the reason. The trials share the library's
//! process-wide table, so each configures device 0 for itself and frees what it allocated
//! (the runner passes `--test-threads=1`).
//!
//! The throwing path of `rmm_rs_torch_alloc` is not here (Rust cannot catch a C++ exception):
//! `tests/c/test_torch_shim.cpp` checks it, on the host and, through `run.sh torch`, on a GPU.

use std::ffi::{c_void, CStr, CString};
use std::io::BufReader;
use std::ptr;

use libtest_mimic::{Arguments, Failed};
use rmm::mr::{parse_log, Action};
use rmm::{CudaStream, DeviceId, DevicePtr};
use rmm_capi::abi::{
    RMM_RS_RESOURCE_ASYNC, RMM_RS_RESOURCE_CUDA, RMM_RS_RESOURCE_POOL, RMM_RS_SIZE_DEFAULT,
};
use rmm_capi::ffi::*;
use rmm_capi::status::*;
use rmm_capi::torch::{rmm_rs_torch_alloc, rmm_rs_torch_free};
use rmm_capi::{RmmRsOptions, RmmRsStatistics};
use rmm_sys::memory;
use rmm_sys::testing::{ensure, gpu, gpu_if, no_pools};

const MIB: u64 = 1 << 20;
const LEGACY: *mut c_void = rmm_sys::CU_STREAM_LEGACY.cast();

fn last_error() -> String {
    // SAFETY: this thread's message, read before its next call.
    unsafe { CStr::from_ptr(rmm_rs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A pool on device 0 (built now) with `initial` and `maximum` bytes.
fn pool_options(initial: u64, maximum: u64) -> RmmRsOptions {
    RmmRsOptions {
        resource: RMM_RS_RESOURCE_POOL,
        initial_pool_size: initial,
        maximum_pool_size: maximum,
        ..RmmRsOptions::default()
    }
}

fn configure(options: RmmRsOptions, devices: Option<&[i32]>) -> Result<(), Failed> {
    let mut options = options;
    if let Some(d) = devices {
        options.num_devices = d.len() as i32;
        options.devices = d.as_ptr();
    }
    // SAFETY: `options` and its pointers live for the call.
    let code = unsafe { rmm_rs_configure(&options) };
    ensure(
        code == RMM_RS_SUCCESS,
        format!("configure: {code}: {}", last_error()),
    )
}

fn stats(device: i32) -> Result<RmmRsStatistics, Failed> {
    let mut s = RmmRsStatistics::default();
    // SAFETY: `s` is writable.
    let code = unsafe { rmm_rs_get_statistics(device, &mut s) };
    ensure(
        code == RMM_RS_SUCCESS,
        format!("statistics: {}", last_error()),
    )?;
    Ok(s)
}

fn alloc(bytes: u64, stream: *mut c_void) -> Result<*mut c_void, Failed> {
    // SAFETY: the stream is special or alive for the call.
    let p = unsafe { rmm_rs_alloc(bytes as isize, 0, stream) };
    ensure(!p.is_null(), format!("{bytes} bytes: {}", last_error()))?;
    Ok(p)
}

fn free(p: *mut c_void, bytes: u64, stream: *mut c_void) -> Result<(), Failed> {
    rmm_rs_clear_last_error();
    // SAFETY: `p` came from `alloc` with `bytes` on device 0; the callers synchronized what
    // used it or order it on `stream`.
    unsafe { rmm_rs_free(p, bytes as isize, 0, stream) };
    ensure(
        rmm_rs_last_error_code() == RMM_RS_SUCCESS,
        format!("free: {}", last_error()),
    )
}

/// Writes a pattern through `stream` into `p` and reads it back.
fn round_trip(p: *mut c_void, bytes: usize, stream: *mut c_void, seed: u8) -> Result<(), Failed> {
    let data: Vec<u8> = (0..bytes)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    let mut back = vec![0u8; bytes];
    let dst = DevicePtr::from_host_ptr(p);
    // SAFETY: `p` holds `bytes` bytes allocated on `stream`'s device; both copies wait.
    unsafe {
        memory::copy_to_device_sync(dst, &data, stream.cast())?;
        memory::copy_to_host_sync(&mut back, dst, stream.cast())?;
    }
    ensure(back == data, "the memory did not hold what was written")
}

fn pool_serves_and_counts() -> Result<(), Failed> {
    configure(pool_options(64 * MIB, 256 * MIB), Some(&[0]))?;
    let s = stats(0)?;
    ensure(
        s.pool_size == 64 * MIB && s.statistics_enabled == 1 && s.current_bytes == 0,
        format!("fresh pool: {s:?}"),
    )?;
    let p = alloc(MIB, ptr::null_mut())?;
    ensure(p as usize % 256 == 0, "not 256-aligned")?;
    round_trip(p, MIB as usize, ptr::null_mut(), 7)?;
    let s = stats(0)?;
    ensure(
        s.current_bytes == MIB as i64 && s.outstanding_allocations == 1,
        format!("after one allocation: {s:?}"),
    )?;
    free(p, MIB, ptr::null_mut())?;
    let s = stats(0)?;
    ensure(
        s.current_bytes == 0 && s.peak_bytes == MIB as i64 && s.outstanding_allocations == 0,
        format!("after the free: {s:?}"),
    )
}

fn over_the_maximum_is_out_of_memory_and_allocation_goes_on() -> Result<(), Failed> {
    configure(pool_options(0, 128 * MIB), Some(&[0]))?;
    rmm_rs_clear_last_error();
    // SAFETY: the legacy stream.
    let p = unsafe { rmm_rs_alloc((512 * MIB) as isize, 0, LEGACY) };
    ensure(p.is_null(), "512 MiB from a 128 MiB pool")?;
    ensure(
        rmm_rs_last_error_code() == RMM_RS_ERROR_OUT_OF_MEMORY,
        format!("code {}", rmm_rs_last_error_code()),
    )?;
    ensure(
        last_error().starts_with("std::bad_alloc: out_of_memory: "),
        last_error(),
    )?;
    let q = alloc(64 * MIB, LEGACY)?;
    round_trip(q, 4096, LEGACY, 1)?;
    free(q, 64 * MIB, LEGACY)?;
    let s = stats(0)?;
    ensure(
        s.failed_allocations == 1 && s.outstanding_allocations == 0,
        format!("{s:?}"),
    )
}

fn a_thread_without_a_context_is_served() -> Result<(), Failed> {
    configure(pool_options(16 * MIB, RMM_RS_SIZE_DEFAULT), Some(&[0]))?;
    std::thread::spawn(|| -> Result<(), Failed> {
        ensure(
            rmm_sys::raw_current_context()?.is_null(),
            "a new thread has a context",
        )?;
        let p = alloc(4096, LEGACY)?;
        round_trip(p, 4096, LEGACY, 3)?;
        free(p, 4096, LEGACY)?;
        ensure(
            rmm_sys::raw_current_context()? == rmm_sys::primary_context(0)?.as_raw(),
            "the thread was left without device 0's primary context",
        )
    })
    .join()
    .map_err(|_| "the thread panicked")?
}

fn a_pool_hit_makes_no_context_call() -> Result<(), Failed> {
    configure(pool_options(16 * MIB, RMM_RS_SIZE_DEFAULT), Some(&[0]))?;
    // One pair first, so that the legacy stream's list holds a free block (the first one may
    // need the driver: its thread keeps the primary context).
    let p = alloc(4096, LEGACY)?;
    free(p, 4096, LEGACY)?;
    std::thread::spawn(|| -> Result<(), Failed> {
        for _ in 0..3 {
            let p = alloc(4096, LEGACY)?;
            free(p, 4096, LEGACY)?;
        }
        // Pool hits on the legacy stream made no CUDA call, so no context either.
        ensure(
            rmm_sys::raw_current_context()?.is_null(),
            "pool hits made a context current",
        )?;
        // A call that needs the device (the copies) still gets device 0's primary context.
        let p = alloc(4096, LEGACY)?;
        round_trip(p, 4096, LEGACY, 5)?;
        free(p, 4096, LEGACY)?;
        ensure(
            rmm_sys::raw_current_context()? == rmm_sys::primary_context(0)?.as_raw(),
            "the thread did not get device 0's primary context for its copies",
        )
    })
    .join()
    .map_err(|_| "the thread panicked")?
}

fn another_devices_context_comes_back() -> Result<(), Failed> {
    configure(pool_options(16 * MIB, RMM_RS_SIZE_DEFAULT), Some(&[0]))?;
    std::thread::spawn(|| -> Result<(), Failed> {
        rmm_sys::set_current_device(DeviceId(1))?;
        let p = alloc(4096, LEGACY)?;
        ensure(
            rmm_sys::current_device()? == DeviceId(1),
            "the call left device 0 current",
        )?;
        free(p, 4096, LEGACY)
    })
    .join()
    .map_err(|_| "the thread panicked")?
}

fn side_stream_allocations() -> Result<(), Failed> {
    configure(pool_options(16 * MIB, RMM_RS_SIZE_DEFAULT), Some(&[0]))?;
    let streams = [CudaStream::non_blocking()?, CudaStream::non_blocking()?];
    let mut held = Vec::new();
    for (i, s) in streams.iter().enumerate() {
        let handle = s.value().cast::<c_void>();
        let p = alloc(3 * MIB, handle)?;
        round_trip(p, 3 * MIB as usize, handle, i as u8)?;
        held.push((p, handle));
    }
    for (p, handle) in held {
        free(p, 3 * MIB, handle)?;
    }
    // Reuse across streams after the frees: the pool orders it with events.
    let p = alloc(5 * MIB, ptr::null_mut())?;
    round_trip(p, 5 * MIB as usize, ptr::null_mut(), 9)?;
    free(p, 5 * MIB, ptr::null_mut())?;
    ensure(stats(0)?.outstanding_allocations == 0, "left outstanding")
}

fn async_resource() -> Result<(), Failed> {
    configure(
        RmmRsOptions {
            resource: RMM_RS_RESOURCE_ASYNC,
            initial_pool_size: 32 * MIB,
            ..RmmRsOptions::default()
        },
        Some(&[0]),
    )?;
    ensure(
        stats(0)?.pool_size >= 32 * MIB,
        "the driver pool was not primed",
    )?;
    let p = alloc(MIB, LEGACY)?;
    round_trip(p, MIB as usize, LEGACY, 5)?;
    free(p, MIB, LEGACY)
}

fn managed_pool_and_plain_resources() -> Result<(), Failed> {
    for options in [
        RmmRsOptions {
            managed_memory: 1,
            ..pool_options(16 * MIB, 64 * MIB)
        },
        RmmRsOptions {
            resource: RMM_RS_RESOURCE_CUDA,
            ..RmmRsOptions::default()
        },
    ] {
        configure(options, Some(&[0]))?;
        let p = alloc(MIB, LEGACY)?;
        round_trip(p, MIB as usize, LEGACY, 2)?;
        free(p, MIB, LEGACY)?;
        let s = stats(0)?;
        ensure(s.total_bytes == MIB as i64, format!("{s:?}"))?;
    }
    Ok(())
}

fn the_log_is_rmms_csv() -> Result<(), Failed> {
    let dir = std::env::temp_dir().join(format!("rmm-capi-gpu-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let base = CString::new(dir.join("log.csv").to_string_lossy().into_owned())?;
    configure(
        RmmRsOptions {
            log_file: base.as_ptr(),
            ..pool_options(0, 64 * MIB)
        },
        Some(&[0]),
    )?;
    let p = alloc(1000, LEGACY)?;
    // SAFETY: the legacy stream.
    let failed = unsafe { rmm_rs_alloc((128 * MIB) as isize, 0, LEGACY) };
    ensure(failed.is_null(), "over the maximum")?;
    free(p, 1000, LEGACY)?;
    ensure(rmm_rs_flush_log(-1) == RMM_RS_SUCCESS, last_error())?;
    let file = std::fs::File::open(dir.join("log.dev0.csv"))?;
    let events = parse_log(BufReader::new(file))?;
    let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
    ensure(
        actions == [Action::Allocate, Action::AllocateFailure, Action::Free],
        format!("{actions:?}"),
    )?;
    ensure(
        events[0].pointer == p as u64 && events[0].size == 1000 && events[0].stream == 1,
        format!("{:?}", events[0]),
    )?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn every_device_is_built_on_first_use() -> Result<(), Failed> {
    configure(pool_options(8 * MIB, RMM_RS_SIZE_DEFAULT), None)?;
    let s = stats(0)?;
    ensure(
        s.pool_size == 0 && s.statistics_enabled == 1,
        format!("built before use: {s:?}"),
    )?;
    let p = alloc(MIB, ptr::null_mut())?;
    ensure(
        stats(0)?.pool_size == 8 * MIB,
        "not built from the template",
    )?;
    free(p, MIB, ptr::null_mut())
}

fn reconfiguration_waits_for_the_last_free() -> Result<(), Failed> {
    configure(pool_options(8 * MIB, RMM_RS_SIZE_DEFAULT), Some(&[0]))?;
    let p = alloc(MIB, LEGACY)?;
    let options = pool_options(8 * MIB, RMM_RS_SIZE_DEFAULT);
    let devices = [0];
    // SAFETY: the options and device list live for the call.
    let code = unsafe {
        rmm_rs_configure(&RmmRsOptions {
            num_devices: 1,
            devices: devices.as_ptr(),
            ..options
        })
    };
    ensure(code == RMM_RS_ERROR_BUSY, format!("code {code}"))?;
    free(p, MIB, LEGACY)?;
    configure(options, Some(&[0]))
}

fn torch_hooks_serve_without_throwing() -> Result<(), Failed> {
    configure(pool_options(8 * MIB, 64 * MIB), Some(&[0]))?;
    // SAFETY: the default stream (the legacy stream for the torch hooks); success does not
    // throw.
    let p = unsafe { rmm_rs_torch_alloc(MIB as isize, 0, ptr::null_mut()) };
    ensure(!p.is_null(), last_error())?;
    round_trip(p, MIB as usize, LEGACY, 4)?;
    // SAFETY: `p` came from the hook with these arguments.
    unsafe { rmm_rs_torch_free(p, MIB as isize, 0, ptr::null_mut()) };
    let s = stats(0)?;
    ensure(
        s.outstanding_allocations == 0 && s.failed_frees == 0,
        format!("{s:?}"),
    )
}

fn two_devices() -> Option<String> {
    match rmm_sys::device_count() {
        Ok(n) if n >= 2 => None,
        Ok(n) => Some(format!("needs two devices, this machine has {n}")),
        Err(e) => Some(e.to_string()),
    }
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu("pool_serves_and_counts", pool_serves_and_counts),
        gpu(
            "over_the_maximum_is_out_of_memory_and_allocation_goes_on",
            over_the_maximum_is_out_of_memory_and_allocation_goes_on,
        ),
        gpu(
            "a_thread_without_a_context_is_served",
            a_thread_without_a_context_is_served,
        ),
        gpu(
            "a_pool_hit_makes_no_context_call",
            a_pool_hit_makes_no_context_call,
        ),
        gpu_if(
            "another_devices_context_comes_back",
            two_devices,
            another_devices_context_comes_back,
        ),
        gpu("side_stream_allocations", side_stream_allocations),
        gpu_if("async_resource", no_pools, async_resource),
        gpu(
            "managed_pool_and_plain_resources",
            managed_pool_and_plain_resources,
        ),
        gpu("the_log_is_rmms_csv", the_log_is_rmms_csv),
        gpu(
            "every_device_is_built_on_first_use",
            every_device_is_built_on_first_use,
        ),
        gpu(
            "reconfiguration_waits_for_the_last_free",
            reconfiguration_waits_for_the_last_free,
        ),
        gpu(
            "torch_hooks_serve_without_throwing",
            torch_hooks_serve_without_throwing,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
