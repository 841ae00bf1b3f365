//! GPU tests of the raw layer. Without a GPU every trial reports itself ignored, with the reason.

use libtest_mimic::{Arguments, Failed};
use rmm_sys::memory::{self, MemLocation};
use rmm_sys::mempool;
use rmm_sys::testing::{ensure, gpu, gpu_if, no_vmm};
use rmm_sys::vmm::{self, Granularity};
use rmm_sys::{
    AllocationHandleType, CudaError, DeferredPrimaryContext, DeviceCapabilities, DeviceGuard,
    DeviceId, DriverVersion, PrimaryContextGuard,
};
use std::sync::Arc;

fn device_count_positive() -> Result<(), Failed> {
    let n = rmm_sys::device_count()?;
    ensure(n > 0, "no device")?;
    let v = rmm_sys::driver_version()?;
    ensure(v >= DriverVersion::MINIMUM, format!("driver {v}"))?;
    let name = rmm_sys::device_name(DeviceId(0))?;
    ensure(!name.is_empty(), "empty device name")
}

fn fresh_thread_gets_device_zero() -> Result<(), Failed> {
    // A new thread has no current context under the driver API; rmm-sys gives it device 0's
    // primary context, as the runtime does.
    let r = std::thread::spawn(|| -> Result<(DeviceId, bool), CudaError> {
        let dev = rmm_sys::current_device()?;
        let p = memory::mem_alloc(1024)?;
        // SAFETY: `p` came from mem_alloc and is unused.
        unsafe { memory::mem_free(p)? };
        Ok((dev, p.is_aligned(256)))
    })
    .join()
    .map_err(|_| "thread panicked")??;
    ensure(
        r.0 == DeviceId(0),
        format!("fresh thread on device {}", r.0),
    )?;
    ensure(r.1, "cuMemAlloc result not 256-aligned")
}

fn primary_context_guard_switches_and_restores() -> Result<(), Failed> {
    // A foreign thread with no context keeps the primary context after the guard.
    let on_fresh = std::thread::spawn(|| -> Result<bool, CudaError> {
        let before = rmm_sys::raw_current_context()?;
        let primary = rmm_sys::primary_context(0)?.as_raw();
        {
            let _g = PrimaryContextGuard::enter(DeviceId(0))?;
            if rmm_sys::raw_current_context()? != primary {
                return Ok(false);
            }
        }
        Ok(before.is_null() && rmm_sys::raw_current_context()? == primary)
    })
    .join()
    .map_err(|_| "thread panicked")??;
    ensure(
        on_fresh,
        "a fresh thread did not keep device 0's primary context",
    )?;
    // With the primary context current, the guard changes nothing.
    rmm_sys::set_current_device(DeviceId(0))?;
    let primary0 = rmm_sys::primary_context(0)?.as_raw();
    drop(PrimaryContextGuard::enter(DeviceId(0))?);
    ensure(
        rmm_sys::raw_current_context()? == primary0,
        "guard changed an already current primary context",
    )?;
    // Another device's context comes back on drop (with two devices or more).
    let n = rmm_sys::device_count()? as i32;
    if n > 1 {
        let last = DeviceId(n - 1);
        {
            let _g = PrimaryContextGuard::enter(last)?;
            ensure(
                rmm_sys::current_device()? == last,
                "guard did not switch device",
            )?;
        }
        ensure(
            rmm_sys::raw_current_context()? == primary0,
            "guard did not restore device 0's context",
        )?;
    }
    Ok(())
}

fn deferred_primary_context() -> Result<(), Failed> {
    // A scope whose calls need no context leaves a fresh thread without one; the first call
    // that needs one enters the scope's context, which the thread keeps.
    let fresh = std::thread::spawn(|| -> Result<(bool, bool, bool), CudaError> {
        let primary = rmm_sys::primary_context(0)?;
        {
            let scope = DeferredPrimaryContext::enter(primary);
            if scope.entered() {
                return Ok((false, false, false));
            }
        }
        let untouched = rmm_sys::raw_current_context()?.is_null();
        let entered = {
            let scope = DeferredPrimaryContext::enter(primary);
            let p = memory::mem_alloc(1024)?;
            // SAFETY: `p` came from mem_alloc and is unused.
            unsafe { memory::mem_free(p)? };
            scope.entered() && rmm_sys::raw_current_context()? == primary.as_raw()
        };
        Ok((
            untouched,
            entered,
            rmm_sys::raw_current_context()? == primary.as_raw(),
        ))
    })
    .join()
    .map_err(|_| "thread panicked")??;
    ensure(fresh.0, "a scope without calls gave the thread a context")?;
    // An ordinary stream's id, asked from a thread without a context, is the stream's.
    let stream = rmm_sys::stream::stream_create(rmm_sys::stream::CU_STREAM_NON_BLOCKING)?;
    // SAFETY: a live stream, destroyed below.
    let id = unsafe { rmm_sys::stream::stream_get_id(stream)? };
    let handle = stream as usize;
    let elsewhere = std::thread::spawn(move || -> Result<u64, CudaError> {
        let _scope = DeferredPrimaryContext::enter(rmm_sys::primary_context(0)?);
        // SAFETY: the stream lives until the thread was joined.
        unsafe { rmm_sys::stream::stream_get_id(handle as rmm_sys::raw::CUstream) }
    })
    .join()
    .map_err(|_| "thread panicked")??;
    // SAFETY: created above, no work queued.
    unsafe { rmm_sys::stream::stream_destroy(stream)? };
    ensure(
        id == elsewhere,
        format!("stream id {id} read as {elsewhere} elsewhere"),
    )?;
    ensure(fresh.1, "a call in the scope did not enter its context")?;
    ensure(fresh.2, "the thread did not keep the primary context")?;
    // Another device's context comes back when the scope ends (with two devices or more).
    let n = rmm_sys::device_count()? as i32;
    if n > 1 {
        let last = DeviceId(n - 1);
        let on_other = std::thread::spawn(move || -> Result<(bool, bool), CudaError> {
            rmm_sys::set_current_device(DeviceId(0))?;
            let primary0 = rmm_sys::primary_context(0)?.as_raw();
            let switched = {
                let _scope = DeferredPrimaryContext::enter(rmm_sys::primary_context(last.0)?);
                let p = memory::mem_alloc(1024)?;
                // SAFETY: `p` came from mem_alloc and is unused.
                unsafe { memory::mem_free(p)? };
                rmm_sys::current_device()? == last
            };
            Ok((switched, rmm_sys::raw_current_context()? == primary0))
        })
        .join()
        .map_err(|_| "thread panicked")??;
        ensure(on_other.0, "the scope's call ran on another device")?;
        ensure(on_other.1, "the scope did not restore device 0's context")?;
    }
    Ok(())
}

fn set_device_and_restore() -> Result<(), Failed> {
    let n = rmm_sys::device_count()? as i32;
    let before = rmm_sys::current_device()?;
    let target = DeviceId(n - 1);
    {
        let _g = DeviceGuard::new(target)?;
        ensure(
            rmm_sys::current_device()? == target,
            "guard did not set device",
        )?;
    }
    ensure(
        rmm_sys::current_device()? == before,
        "guard did not restore",
    )?;
    ensure(
        DeviceGuard::new(DeviceId(n)).is_err(),
        "out-of-range device accepted",
    )?;
    ensure(
        rmm_sys::current_device()? == before,
        "failed guard changed device",
    )
}

fn memory_info() -> Result<(), Failed> {
    let (free, total) = rmm_sys::available_device_memory()?;
    ensure(
        free > 0 && free <= total,
        format!("free {free} total {total}"),
    )?;
    let half = rmm_sys::percent_of_free_device_memory(50)?;
    ensure(half % 256 == 0, "not aligned")?;
    ensure(half <= total / 2 + 256, format!("50% = {half} of {total}"))
}

fn out_of_memory_is_typed() -> Result<(), Failed> {
    let e = memory::mem_alloc(1 << 52).expect_err("a 4 PiB cuMemAlloc succeeded");
    ensure(e.is_out_of_memory(), format!("not OOM: {e}"))?;
    ensure(
        e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"),
        e.to_string(),
    )
}

fn capabilities() -> Result<(), Failed> {
    let caps = DeviceCapabilities::probe(DeviceId(0))?;
    ensure(
        caps.memory_pools_supported,
        "H100/H200 support memory pools",
    )?;
    ensure(
        caps.supports_handle_type(rmm_sys::AllocationHandleType::PosixFileDescriptor),
        format!("handle types {:#x}", caps.supported_handle_types),
    )
}

/// The typed accessors that replace raw attribute reads: compute capability, name, memory.
fn device_accessors() -> Result<(), Failed> {
    let dev = DeviceId(0);
    let cc = dev.compute_capability()?;
    ensure(
        cc.major >= 7 && cc.minor < 10,
        format!("implausible compute capability {cc}"),
    )?;
    let name = dev.name()?;
    ensure(
        name.contains("NVIDIA"),
        format!("device name {name:?} does not name NVIDIA"),
    )?;
    let total = dev.total_memory()?;
    let (_, total_here) = rmm_sys::available_device_memory()?;
    ensure(
        total == total_here && total > (1 << 30),
        format!("total memory {total} vs cuMemGetInfo {total_here}"),
    )?;
    ensure(
        dev.capabilities()? == DeviceCapabilities::probe(dev)?,
        "capabilities differ between the accessor and the probe",
    )
}

fn newer_entry_points_resolve() -> Result<(), Failed> {
    let v = rmm_sys::driver_version()?;
    let r = mempool::default_managed_mem_pool(DeviceId(0));
    if v >= DriverVersion::CUDA_13_0 {
        let pool = r?;
        ensure(!pool.is_null(), "null managed pool")?;
    } else {
        ensure(
            matches!(r, Err(CudaError::EntryPointUnavailable { .. })),
            "pre-13 driver resolved cuMemGetDefaultMemPool",
        )?;
    }
    // Prefetching device memory is an invalid value; managed memory prefetches.
    let p = memory::mem_alloc_managed(1 << 20)?;
    ensure(
        memory::pointer_is_managed(p)?,
        "managed pointer not managed",
    )?;
    // SAFETY: the legacy stream is always valid; `p` is live managed memory.
    unsafe {
        memory::mem_prefetch_async(
            p,
            1 << 20,
            MemLocation::Device(0),
            rmm_sys::CU_STREAM_LEGACY,
        )?;
        memory::mem_prefetch_async(p, 1 << 20, MemLocation::Host, rmm_sys::CU_STREAM_LEGACY)?;
        rmm_sys::stream::stream_synchronize(rmm_sys::CU_STREAM_LEGACY)?;
        memory::mem_free(p)?;
    }
    let d = memory::mem_alloc(1 << 20)?;
    ensure(!memory::pointer_is_managed(d)?, "device pointer managed")?;
    // SAFETY: `d` is live and unused.
    unsafe { memory::mem_free(d)? };
    Ok(())
}

fn pool_roundtrip_and_attributes() -> Result<(), Failed> {
    use rmm_sys::MemPoolAttribute as A;
    let pool = mempool::mem_pool_create(DeviceId(0), rmm_sys::AllocationHandleType::None)?;
    let s = rmm_sys::CU_STREAM_LEGACY;
    // SAFETY: the pool was created above and is destroyed last; the legacy stream is valid; the
    // pointer is freed once.
    unsafe {
        mempool::mem_pool_set_attribute(pool, A::ReleaseThreshold, u64::MAX)?;
        ensure(
            mempool::mem_pool_get_attribute(pool, A::ReleaseThreshold)? == u64::MAX,
            "threshold not read back",
        )?;
        let p = mempool::mem_alloc_from_pool_async(1 << 20, pool, s)?;
        memory::memset_d32_async(p, 0xdead_beef, (1 << 20) / 4, s)?;
        let mut host = vec![0u8; 16];
        memory::copy_to_host_sync(&mut host, p, s)?;
        ensure(
            host.chunks(4).all(|c| c == 0xdead_beefu32.to_ne_bytes()),
            "memset pattern not read back",
        )?;
        ensure(
            mempool::mem_pool_get_attribute(pool, A::UsedMemCurrent)? >= 1 << 20,
            "used memory not counted",
        )?;
        mempool::mem_free_async(p, s)?;
        rmm_sys::stream::stream_synchronize(s)?;
        ensure(
            mempool::mem_pool_get_attribute(pool, A::ReservedMemCurrent)? >= 1 << 20,
            "threshold u64::MAX should keep memory reserved",
        )?;
        mempool::mem_pool_trim_to(pool, 0)?;
        ensure(
            mempool::mem_pool_get_attribute(pool, A::ReservedMemCurrent)? == 0,
            "trim_to(0) kept memory",
        )?;
        mempool::mem_pool_destroy(pool)?;
    }
    Ok(())
}

fn pinned_host_roundtrip() -> Result<(), Failed> {
    let p = memory::mem_host_alloc(4096)?;
    ensure(!p.is_null() && p.is_aligned(256), "pinned pointer")?;
    // SAFETY: `p` is 4096 bytes of pinned host memory, unused elsewhere.
    unsafe {
        std::ptr::write_bytes(p.as_host_ptr::<u8>(), 7, 4096);
        let d = memory::mem_alloc(4096)?;
        memory::memcpy_async(d, p, 4096, rmm_sys::CU_STREAM_LEGACY)?;
        let mut back = vec![0u8; 4096];
        memory::copy_to_host_sync(&mut back, d, rmm_sys::CU_STREAM_LEGACY)?;
        ensure(back.iter().all(|&b| b == 7), "pinned copy mismatch")?;
        memory::mem_free(d)?;
        memory::mem_free_host(p)?;
    }
    Ok(())
}

/// Driver results are read as integers end to end: wrapped calls succeed, a call that fails
/// with a known code names it (through the driver's `cuGetErrorName` of the integer), and an
/// unknown code is an error carrying its number, whatever the driver says of it.
fn integer_results_end_to_end() -> Result<(), Failed> {
    // Successes through the integer path.
    let device = rmm_sys::current_device()?;
    ensure(device.value() >= 0, format!("current device {device}"))?;
    let (free, total) = rmm_sys::available_device_memory()?;
    ensure(
        free <= total && total > 0,
        format!("free {free} total {total}"),
    )?;
    let stream = rmm_sys::stream::stream_create(rmm_sys::stream::CU_STREAM_NON_BLOCKING)?;
    let event = rmm_sys::stream::event_create(rmm_sys::stream::CU_EVENT_DISABLE_TIMING)?;
    // SAFETY: `stream` and `event` were created above and are destroyed last.
    unsafe {
        rmm_sys::stream::event_record(event, stream)?;
        rmm_sys::stream::stream_synchronize(stream)?;
        ensure(
            rmm_sys::stream::stream_query(stream)?,
            "idle stream not complete",
        )?;
        ensure(
            rmm_sys::stream::event_query(event)?,
            "event of a synchronized stream not complete",
        )?;
        ensure(
            rmm_sys::stream::stream_get_id(stream)?
                != rmm_sys::stream::stream_get_id(rmm_sys::CU_STREAM_LEGACY)?,
            "a new stream has the legacy stream's id",
        )?;
        rmm_sys::stream::event_destroy(event)?;
        rmm_sys::stream::stream_destroy(stream)?;
    }

    // A known failure: cuMemAlloc of 0 bytes is CUDA_ERROR_INVALID_VALUE.
    let e = memory::mem_alloc(0).expect_err("cuMemAlloc(0) succeeded");
    ensure(
        e.code() == Some(rmm_sys::ResultCode::INVALID_VALUE),
        format!("cuMemAlloc(0): expected CUDA_ERROR_INVALID_VALUE (1), got {e:?}"),
    )?;
    match &e {
        CudaError::Call {
            call,
            name,
            description,
            ..
        } => {
            ensure(*call == "cuMemAlloc", format!("call {call}"))?;
            ensure(
                name == "CUDA_ERROR_INVALID_VALUE",
                format!("the driver's name of code 1 is {name:?}"),
            )?;
            ensure(!description.is_empty(), "no description from the driver")?;
        }
        other => return Err(format!("not a call error: {other:?}").into()),
    }
    // Another known failure, on a call that takes a device ordinal.
    let n = rmm_sys::device_count()? as i32;
    let e = rmm_sys::device_name(DeviceId(n)).expect_err("an out-of-range device has a name");
    ensure(
        e.code().is_some_and(|c| c.0 != 0),
        format!("out-of-range device: {e:?}"),
    )?;

    // An unknown code, described with the driver loaded: cuGetErrorName refuses it, and the
    // error still carries the number.
    let e = CudaError::from_raw_code("cuFuture", 987_654);
    ensure(
        e.code() == Some(rmm_sys::ResultCode(987_654)),
        format!("{e:?}"),
    )?;
    ensure(e.to_string().contains("987654"), e.to_string())
}

/// Why memory cannot be exported as a POSIX file descriptor here, or `None`.
fn no_vmm_fd() -> Option<String> {
    no_vmm().or_else(
        || match rmm_sys::current_device().and_then(vmm::posix_fd_supported) {
            Ok(true) => None,
            Ok(false) => Some("the device cannot export POSIX file descriptors".into()),
            Err(e) => Some(format!("cannot probe the device: {e}")),
        },
    )
}

/// Reserve a range, map two chunks one after the other, write across their boundary and read
/// it back, unmap one, drop everything (unmap, release, free the range).
fn vmm_map_write_read_unmap() -> Result<(), Failed> {
    let dev = rmm_sys::current_device()?;
    let none = AllocationHandleType::None;
    let min = vmm::allocation_granularity(dev, none, Granularity::Minimum)?;
    let rec = vmm::allocation_granularity(dev, none, Granularity::Recommended)?;
    ensure(
        min > 0 && rec % min == 0,
        format!("granularities {min} / {rec}"),
    )?;
    let range = Arc::new(vmm::AddressRange::reserve(4 * min, min)?);
    ensure(range.base().is_aligned(min), "range misaligned")?;
    let first = vmm::Mapping::new(
        &range,
        0,
        vmm::PhysicalMemory::create(dev, min, none)?,
        &[dev],
    )?;
    let second = vmm::Mapping::new(
        &range,
        min,
        vmm::PhysicalMemory::create(dev, min, none)?,
        &[dev],
    )?;
    ensure(
        second.addr().addr() == first.addr().addr() + min as u64,
        "the chunks are not adjacent",
    )?;
    // Mapping over a mapped chunk, outside the range or with no device is refused.
    let again = vmm::Mapping::new(
        &range,
        0,
        vmm::PhysicalMemory::create(dev, min, none)?,
        &[dev],
    );
    ensure(again.is_err(), "mapped twice at one offset")?;
    let outside = vmm::Mapping::new(
        &range,
        4 * min,
        vmm::PhysicalMemory::create(dev, min, none)?,
        &[dev],
    );
    ensure(outside.is_err(), "mapped outside the range")?;
    let nobody = vmm::Mapping::new(
        &range,
        2 * min,
        vmm::PhysicalMemory::create(dev, min, none)?,
        &[],
    );
    ensure(nobody.is_err(), "mapped for no device")?;
    // 1 MiB across the boundary.
    let at = rmm_sys::DevicePtr::from_raw(first.addr().addr() + min as u64 - (512 << 10));
    let data: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + 3) as u8).collect();
    let mut back = vec![0u8; data.len()];
    // SAFETY: `[at, at + 1 MiB)` lies in the two mappings, which live until the end.
    unsafe {
        memory::copy_to_device_sync(at, &data, rmm_sys::CU_STREAM_LEGACY)?;
        memory::copy_to_host_sync(&mut back, at, rmm_sys::CU_STREAM_LEGACY)?;
    }
    ensure(back == data, "data across the chunk boundary differs")?;
    let memory = second.unmap().map_err(|(_, e)| e)?;
    ensure(memory.size() == min, "unmapped memory has another size")?;
    drop(memory);
    drop(range); // the first mapping still holds the range
    drop(first);
    Ok(())
}

/// Export a chunk as a file descriptor, import it, map it a second time elsewhere and read
/// what was written through the first mapping.
fn vmm_export_import_posix_fd() -> Result<(), Failed> {
    let dev = rmm_sys::current_device()?;
    let fd_type = AllocationHandleType::PosixFileDescriptor;
    let g = vmm::allocation_granularity(dev, fd_type, Granularity::Minimum)?;
    let a = Arc::new(vmm::AddressRange::reserve(g, g)?);
    let mapped = vmm::Mapping::new(&a, 0, vmm::PhysicalMemory::create(dev, g, fd_type)?, &[dev])?;
    let data = vec![0x5au8; 4096];
    // SAFETY: the first 4 KiB of the mapping, which lives until the end.
    unsafe { memory::copy_to_device_sync(mapped.addr(), &data, rmm_sys::CU_STREAM_LEGACY)? };
    let fd = mapped.memory().ok_or("no memory")?.export_posix_fd()?;
    let imported = vmm::PhysicalMemory::import_posix_fd(std::os::fd::AsFd::as_fd(&fd), g, dev)?;
    let b = Arc::new(vmm::AddressRange::reserve(g, g)?);
    let again = vmm::Mapping::new(&b, 0, imported, &[dev])?;
    let mut back = vec![0u8; 4096];
    // SAFETY: as above, through the second mapping of the same memory.
    unsafe { memory::copy_to_host_sync(&mut back, again.addr(), rmm_sys::CU_STREAM_LEGACY)? };
    ensure(back == data, "the imported memory holds other data")?;
    // Memory made without an export handle type cannot be exported.
    let plain = vmm::PhysicalMemory::create(dev, g, AllocationHandleType::None)?;
    ensure(
        plain.export_posix_fd().is_err(),
        "exported unexportable memory",
    )
}

/// A one-thread kernel that stores `value` at `out`.
const PUT_PTX: &std::ffi::CStr = c"
.version 7.0
.target sm_52
.address_size 64

.visible .entry put(
	.param .u64 put_param_out,
	.param .u32 put_param_value
)
{
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [put_param_out];
	ld.param.u32 	%r1, [put_param_value];
	cvta.to.global.u64 	%rd2, %rd1;
	st.global.u32 	[%rd2], %r1;
	ret;
}
";

/// PTX loaded, its kernel found and launched through rmm-sys's integer entry points; a
/// missing kernel and malformed PTX are typed errors carrying the driver's code.
fn kernel_load_launch_and_errors() -> Result<(), Failed> {
    let module = rmm_sys::kernel::Module::load_ptx(PUT_PTX)?;
    let put = module.function(c"put")?;
    let out = memory::mem_alloc(4)?;
    let mut addr = out.addr();
    let mut value: u32 = 0x1234_5678;
    let mut params: [*mut std::ffi::c_void; 2] = [
        (&mut addr as *mut u64).cast(),
        (&mut value as *mut u32).cast(),
    ];
    let mut host = [0u8; 4];
    // SAFETY: the parameters match `put(u32*, u32)`; `out` is 4 bytes of this context's
    // memory; the legacy stream is valid; the copy synchronizes before the module drops.
    unsafe {
        put.launch(
            [1, 1, 1],
            [1, 1, 1],
            0,
            rmm_sys::CU_STREAM_LEGACY,
            &mut params,
        )?;
        memory::copy_to_host_sync(&mut host, out, rmm_sys::CU_STREAM_LEGACY)?;
        memory::mem_free(out)?;
    }
    ensure(
        u32::from_ne_bytes(host) == 0x1234_5678,
        format!("the kernel wrote {:#x}", u32::from_ne_bytes(host)),
    )?;
    // CUDA_ERROR_NOT_FOUND (500).
    let missing = module.function(c"absent").map(|_| ()).unwrap_err();
    ensure(
        missing.code().map(|c| c.0) == Some(500),
        format!("a missing kernel: {missing}"),
    )?;
    let malformed = rmm_sys::kernel::Module::load_ptx(c"not ptx").map(|_| ());
    ensure(
        malformed.as_ref().is_err_and(|e| e.code().is_some()),
        format!("malformed PTX: {malformed:?}"),
    )
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu("device_count_positive", device_count_positive),
        gpu(
            "fresh_thread_gets_device_zero",
            fresh_thread_gets_device_zero,
        ),
        gpu("set_device_and_restore", set_device_and_restore),
        gpu(
            "primary_context_guard_switches_and_restores",
            primary_context_guard_switches_and_restores,
        ),
        gpu("deferred_primary_context", deferred_primary_context),
        gpu("memory_info", memory_info),
        gpu("out_of_memory_is_typed", out_of_memory_is_typed),
        gpu("capabilities", capabilities),
        gpu("device_accessors", device_accessors),
        gpu("newer_entry_points_resolve", newer_entry_points_resolve),
        gpu(
            "pool_roundtrip_and_attributes",
            pool_roundtrip_and_attributes,
        ),
        gpu("pinned_host_roundtrip", pinned_host_roundtrip),
        gpu("integer_results_end_to_end", integer_results_end_to_end),
        gpu(
            "kernel_load_launch_and_errors",
            kernel_load_launch_and_errors,
        ),
        gpu_if("vmm_map_write_read_unmap", no_vmm, vmm_map_write_read_unmap),
        gpu_if(
            "vmm_export_import_posix_fd",
            no_vmm_fd,
            vmm_export_import_posix_fd,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
