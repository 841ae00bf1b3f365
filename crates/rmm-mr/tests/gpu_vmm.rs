//! GPU tests of the VMM pool: the fragmentation scenarios of RMM issues 1957, 496 and 2039
//! (against the plain pool where RMM's fails), memory contents across chunk boundaries,
//! releasing memory to the device, IPC export, peer access, and every driver step of growth and
//! release failing. Its conformance suite runs in `gpu_conformance`, its stream-ordering trials
//! in `gpu_suballocators` (`vmm_pool/...`). Without a GPU, or on a device without virtual
//! memory management, every trial reports itself ignored, with the reason. Runs in both
//! `RMM_DEFAULT_STREAM` modes in the GPU bundle; trials run one at a time (some take a large
//! share of the device memory).

use libtest_mimic::{Arguments, Failed};
use rmm_mr::testing::fragmentation::{largest_allocation, run, MultiStream};
use rmm_mr::{
    CudaMemoryResource, DeviceMemoryResource, MrError, PoolMemoryResource, PoolOptions,
    VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};
use rmm_sys::testing::{ensure, gpu_if, no_vmm};
use rmm_sys::{memory, AllocationHandleType, DeviceGuard, DeviceId, DevicePtr};

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

fn no_fd_export() -> Option<String> {
    no_vmm().or_else(|| {
        match rmm_sys::current_device().and_then(rmm_sys::vmm::posix_fd_supported) {
            Ok(true) => None,
            Ok(false) => Some("the device cannot export POSIX file descriptors".into()),
            Err(e) => Some(format!("cannot probe the device: {e}")),
        }
    })
}

fn no_second_device() -> Option<String> {
    no_vmm().or_else(|| match rmm_sys::device_count() {
        Ok(n) if n >= 2 => None,
        Ok(n) => Some(format!("needs two devices, found {n}")),
        Err(e) => Some(e.to_string()),
    })
}

/// `cap`, or 40 % of the device's free memory if that is less, in whole 64 MiB.
fn scaled(cap: usize) -> Result<usize, Failed> {
    let free = rmm_sys::available_device_memory()?.0;
    let bytes = cap.min(free / 10 * 4);
    Ok(bytes - bytes % (64 * MIB))
}

fn legacy() -> CudaStreamView<'static> {
    CudaStreamView::legacy()
}

/// Writes `value` into every word of `[p, p + bytes)` on `s`.
fn fill(p: DevicePtr, bytes: usize, value: u32, s: CudaStreamView<'_>) -> Result<(), Failed> {
    // SAFETY: the callers pass a live allocation of at least `bytes` bytes usable on `s`.
    unsafe { memory::memset_d32_async(p, value, bytes / 4, s.as_raw())? };
    Ok(())
}

/// Checks that the words at the start, in the middle and at the end of `[p, p + bytes)` are
/// `value` (1 MiB at each place, or all of it), synchronizing `s`.
fn holds(p: DevicePtr, bytes: usize, value: u32, s: CudaStreamView<'_>) -> Result<(), Failed> {
    let window = bytes.min(MIB);
    for at in [0, (bytes - window) / 2 / 256 * 256, bytes - window] {
        let mut host = vec![0u8; window];
        let q = DevicePtr::from_raw(p.addr() + at as u64);
        // SAFETY: `[q, q + window)` lies in the caller's live allocation.
        unsafe { memory::copy_to_host_sync(&mut host, q, s.as_raw())? };
        if let Some(i) = host.chunks_exact(4).position(|w| w != value.to_ne_bytes()) {
            return Err(format!("word {} of {p} (+{at}) is not {value:#x}", i + at / 4).into());
        }
    }
    Ok(())
}

fn free(mr: &dyn DeviceMemoryResource, p: DevicePtr, bytes: usize) -> Result<(), Failed> {
    // SAFETY: every caller frees what it allocated from `mr` on the legacy stream with this
    // size, after the work on it (legacy stream, or synchronized).
    unsafe { mr.deallocate(legacy(), p, bytes, 256)? };
    Ok(())
}

/// RMM issue 1957: initial 2 MiB, maximum 64 MiB, one allocation of 64 MiB. The VMM pool
/// serves it (and the memory holds data end to end); the plain pool cannot while a block of its
/// initial chunk is in use, and serves it once that chunk is free (it gives the chunk back and
/// grows one of 64 MiB; RMM's pool fails).
fn issue_1957() -> Result<(), Failed> {
    let options = VmmPoolOptions::new(64 * MIB).initial_pool_size(2 * MIB);
    let vmm = VmmPoolMemoryResource::with_options(options)?;
    let all = vmm.allocate(legacy(), 64 * MIB, 256)?;
    ensure(all == vmm.address_base(), "not one block from the start")?;
    fill(all, 64 * MIB, 0x1957_1957, legacy())?;
    holds(all, 64 * MIB, 0x1957_1957, legacy())?;
    free(&vmm, all, 64 * MIB)?;
    let options = PoolOptions::new(2 * MIB).maximum_pool_size(64 * MIB);
    let pool = PoolMemoryResource::with_options(CudaMemoryResource::new(), options)?;
    let held = pool.allocate(legacy(), 256, 256)?;
    match pool.allocate(legacy(), 64 * MIB, 256) {
        Err(e) if e.is_out_of_memory() => {}
        Err(e) => return Err(format!("the plain pool failed with {e}, not out-of-memory").into()),
        Ok(p) => {
            free(&pool, p, 64 * MIB)?;
            return Err("the plain pool served 64 MiB with its initial chunk in use".into());
        }
    }
    free(&pool, held, 256)?;
    let all = pool.allocate(legacy(), 64 * MIB, 256)?;
    fill(all, 64 * MIB, 0x1957, legacy())?;
    holds(all, 64 * MIB, 0x1957, legacy())?;
    free(&pool, all, 64 * MIB)?;
    ensure(
        pool.pool_size() == 64 * MIB,
        format!("the plain pool holds {} bytes", pool.pool_size()),
    )
}

/// RMM issue 496, scaled to the device: grow with 8 MiB allocations to 75 % of the maximum,
/// free them all, then two allocations of 40 % each. The VMM pool serves both; so does the plain
/// pool (two chunks, half and a quarter of the maximum, which RMM's cannot merge), by giving
/// its wholly free chunks back before the second fails.
fn issue_496() -> Result<(), Failed> {
    let max = scaled(8 * GIB)?;
    let large = max / 5 * 2 / 256 * 256;
    let small = 8 * MIB;
    let try_on = |mr: &dyn DeviceMemoryResource| -> Result<(bool, bool), Failed> {
        let mut blocks = Vec::new();
        while blocks.len() * small < max / 4 * 3 {
            blocks.push(mr.allocate(legacy(), small, 256)?);
        }
        for p in blocks {
            free(mr, p, small)?;
        }
        let a = mr.allocate(legacy(), large, 256);
        let b = mr.allocate(legacy(), large, 256);
        let got = (a.is_ok(), b.is_ok());
        for (i, p) in [a, b].into_iter().enumerate() {
            match p {
                Ok(p) => {
                    fill(p, large, 0x496 + i as u32, legacy())?;
                    holds(p, large, 0x496 + i as u32, legacy())?;
                    free(mr, p, large)?;
                }
                Err(e) if e.is_out_of_memory() => {}
                Err(e) => return Err(format!("{e}").into()),
            }
        }
        Ok(got)
    };
    let vmm = try_on(&VmmPoolMemoryResource::new(max)?)?;
    let pool = try_on(&PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(0).maximum_pool_size(max),
    )?)?;
    eprintln!(
        "issue 496, maximum {} MiB: vmm_pool {vmm:?}, pool {pool:?}",
        max / MIB
    );
    ensure(vmm == (true, true), format!("the VMM pool served {vmm:?}"))?;
    ensure(
        pool == (true, true),
        format!("the plain pool served {pool:?}, expected (true, true)"),
    )
}

/// RMM issue 2039's shape: four streams, mixed sizes, each block freed on another stream than
/// its own. Afterwards the VMM pool, and the plain pool (which gives its free chunks back
/// before it fails), serve at least 95 % of their maximum in one allocation.
fn multi_stream_workload() -> Result<(), Failed> {
    let max = scaled(4 * GIB)?;
    let streams: Vec<CudaStream> = (0..4)
        .map(|_| CudaStream::non_blocking())
        .collect::<Result<_, _>>()?;
    let views: Vec<CudaStreamView<'_>> = streams.iter().map(CudaStream::view).collect();
    let vmm = VmmPoolMemoryResource::new(max)?;
    let pool = PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(0).maximum_pool_size(max),
    )?;
    for (name, mr, size) in [
        (
            "vmm_pool",
            &vmm as &dyn DeviceMemoryResource,
            Box::new(|| vmm.pool_size()) as Box<dyn Fn() -> usize>,
        ),
        ("pool", &pool, Box::new(|| pool.pool_size())),
    ] {
        let out = run(mr, &views, &MultiStream::scaled(max), &*size)?;
        let largest = largest_allocation(mr, views[0], max, MIB)?;
        eprintln!(
            "{name}, maximum {} MiB: {out:?}, largest after {} MiB",
            max / MIB,
            largest / MIB
        );
        ensure(
            out.failed == 0,
            format!("{name}: {} allocations failed", out.failed),
        )?;
        ensure(
            largest >= max / 100 * 95,
            format!("{name}: largest allocation {largest} of {max} free bytes"),
        )?;
        for v in &views {
            v.synchronize()?;
        }
    }
    ensure(vmm.outstanding_allocations() == 0, "allocations left")?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")
}

/// Many growths of one granule, then one block over all of them, written and read end to end.
fn blocks_span_chunks_and_hold_data() -> Result<(), Failed> {
    // Growth by what the request lacks only (the default would double and map fewer chunks).
    let vmm = VmmPoolMemoryResource::with_options(VmmPoolOptions::new(GIB).min_growth_percent(0))?;
    let g = vmm.granularity();
    let pieces: Vec<DevicePtr> = (0..16)
        .map(|_| vmm.allocate(legacy(), g, 256))
        .collect::<Result<_, MrError>>()?;
    ensure(
        vmm.chunk_count() == 16,
        format!("{} chunks", vmm.chunk_count()),
    )?;
    for (i, &p) in pieces.iter().enumerate() {
        fill(p, g, i as u32, legacy())?;
    }
    for (i, &p) in pieces.iter().enumerate() {
        holds(p, g, i as u32, legacy())?;
    }
    for p in pieces {
        free(&vmm, p, g)?;
    }
    let all = vmm.allocate(legacy(), 16 * g, 256)?;
    ensure(
        all == vmm.address_base(),
        "the 16 chunks did not serve one block",
    )?;
    ensure(vmm.chunk_count() == 16, "the pool grew")?;
    fill(all, 16 * g, 0xc0ff_ee00, legacy())?;
    holds(all, 16 * g, 0xc0ff_ee00, legacy())?;
    free(&vmm, all, 16 * g)
}

/// `release_unused` gives unused chunks back to the device (its free memory grows), keeps a
/// live block's chunk and contents, and dropping the pool gives back the rest.
fn release_unused_returns_memory() -> Result<(), Failed> {
    let _serial = rmm_sys::testing::one_at_a_time();
    let chunk = 256 * MIB;
    // One chunk per block: growth by what the request lacks only.
    let options = VmmPoolOptions::new(4 * GIB)
        .granularity(chunk)
        .min_growth_percent(0);
    let free_now = || rmm_sys::available_device_memory().map(|m| m.0);
    let start = free_now()?;
    let vmm = VmmPoolMemoryResource::with_options(options)?;
    let blocks: Vec<DevicePtr> = (0..4)
        .map(|_| vmm.allocate(legacy(), chunk, 256))
        .collect::<Result<_, MrError>>()?;
    fill(blocks[2], chunk, 0x7ee1, legacy())?;
    let grown = free_now()?;
    ensure(
        start.saturating_sub(grown) >= 4 * chunk,
        format!(
            "the device lost {} MiB for 1 GiB mapped",
            start.saturating_sub(grown) / MIB
        ),
    )?;
    for i in [0, 1, 3] {
        free(&vmm, blocks[i], chunk)?;
    }
    let released = vmm.release_unused()?;
    ensure(released == 3 * chunk, format!("released {released}"))?;
    ensure(
        vmm.pool_size() == chunk,
        format!("{} mapped", vmm.pool_size()),
    )?;
    let after = free_now()?;
    ensure(
        after.saturating_sub(grown) >= 3 * chunk - 64 * MIB,
        format!(
            "the device got {} MiB back of {} MiB released",
            after.saturating_sub(grown) / MIB,
            released / MIB
        ),
    )?;
    holds(blocks[2], chunk, 0x7ee1, legacy())?;
    // The hole before the live block is mapped again when the end lacks room for a request;
    // with room at the end, growth goes there.
    let next = vmm.allocate(legacy(), chunk, 256)?;
    ensure(
        next.addr() == blocks[2].addr() + chunk as u64,
        "growth did not go to the end",
    )?;
    free(&vmm, next, chunk)?;
    // Dropped with an allocation outstanding: everything goes back.
    drop(vmm);
    let end = free_now()?;
    ensure(
        end + 64 * MIB >= start,
        format!("{} MiB not given back", start.saturating_sub(end) / MIB),
    )
}

/// The chunks exported as file descriptors, imported and mapped at the same offsets of a
/// second range: the second mapping reads what was written through the pool.
fn export_chunks_map_elsewhere() -> Result<(), Failed> {
    use rmm_sys::vmm::{AddressRange, Mapping, PhysicalMemory};
    let dev = rmm_sys::current_device()?;
    let options = VmmPoolOptions::new(64 * MIB)
        .initial_pool_size(8 * MIB)
        .export_handle_type(AllocationHandleType::PosixFileDescriptor);
    let vmm = VmmPoolMemoryResource::with_options(options)?;
    let p = vmm.allocate(legacy(), 12 * MIB, 256)?;
    fill(p, 12 * MIB, 0x1bc0_0001, legacy())?;
    legacy().synchronize()?;
    let chunks = vmm.export_chunks()?;
    ensure(
        !chunks.is_empty() && chunks.len() == vmm.chunk_count(),
        format!("{} chunks exported of {}", chunks.len(), vmm.chunk_count()),
    )?;
    let range = std::sync::Arc::new(AddressRange::reserve(
        vmm.maximum_pool_size(),
        vmm.granularity(),
    )?);
    let mut mappings = Vec::new();
    for c in &chunks {
        let memory = PhysicalMemory::import_posix_fd(std::os::fd::AsFd::as_fd(&c.fd), c.size, dev)?;
        mappings.push(Mapping::new(&range, c.offset, memory, &[dev])?);
    }
    let offset = p.addr() - vmm.address_base().addr();
    let mirror = DevicePtr::from_raw(range.base().addr() + offset);
    holds(mirror, 12 * MIB, 0x1bc0_0001, legacy())?;
    drop(mappings);
    free(&vmm, p, 12 * MIB)
}

/// With the second device granted access, a stream of the second device writes into the pool's
/// memory, which the first device reads back.
fn peer_access() -> Result<(), Failed> {
    let options = VmmPoolOptions::new(GIB).peer_access([DeviceId(1)]);
    let vmm = VmmPoolMemoryResource::with_options(options)?;
    let p = vmm.allocate(legacy(), 4 * MIB, 256)?;
    legacy().synchronize()?;
    {
        let _on = DeviceGuard::new(DeviceId(1))?;
        let s = CudaStream::non_blocking()?;
        fill(p, 4 * MIB, 0x9ee7, s.view())?;
        s.synchronize()?;
    }
    holds(p, 4 * MIB, 0x9ee7, legacy())?;
    free(&vmm, p, 4 * MIB)
}

/// Each driver step of growth fails in turn: the allocation fails, nothing is mapped or
/// leaked, and the next allocation works. A failing reservation fails construction with
/// out-of-memory; a failing unmap keeps the chunk, usable, and a later release works.
fn driver_failures_change_nothing() -> Result<(), Failed> {
    let _serial = rmm_sys::testing::one_at_a_time();
    let _scope = FaultScope::new();
    fault::inject(Fault::next(DriverCall::AddressReserve));
    match VmmPoolMemoryResource::new(GIB) {
        Err(e) if e.is_out_of_memory() => {}
        other => return Err(format!("reservation fault: {other:?}").into()),
    }
    let chunk = 64 * MIB;
    let vmm = VmmPoolMemoryResource::with_options(
        VmmPoolOptions::new(GIB)
            .granularity(chunk)
            .min_growth_percent(0),
    )?;
    let keep = vmm.allocate(legacy(), MIB, 256)?;
    let free_before = rmm_sys::available_device_memory()?.0;
    for fault in [
        Fault::nth(DriverCall::MemCreate, 0),
        Fault::nth(DriverCall::MemMap, 0),
        Fault::nth(DriverCall::MemMap, 1),
    ] {
        for _ in 0..4 {
            let (size, chunks) = (vmm.pool_size(), vmm.chunk_count());
            fault::inject(fault);
            let e = match vmm.allocate(legacy(), 2 * chunk, 256) {
                Err(e) => e,
                Ok(p) => {
                    free(&vmm, p, 2 * chunk)?;
                    return Err(format!("{fault:?}: the allocation succeeded").into());
                }
            };
            ensure(
                fault::injected(fault.call) > 0,
                format!("{fault:?} never fired ({e})"),
            )?;
            ensure(
                (vmm.pool_size(), vmm.chunk_count()) == (size, chunks),
                format!("{fault:?}: the pool changed ({e})"),
            )?;
            fault::reset();
        }
    }
    let free_after = rmm_sys::available_device_memory()?.0;
    ensure(
        free_after + chunk > free_before,
        format!(
            "{} MiB leaked by failed growths",
            free_before.saturating_sub(free_after) / MIB
        ),
    )?;
    let p = vmm.allocate(legacy(), 2 * chunk, 256)?;
    fill(p, 2 * chunk, 0xfa17, legacy())?;
    holds(p, 2 * chunk, 0xfa17, legacy())?;
    free(&vmm, p, 2 * chunk)?;
    // A failing unmap: the chunk stays mapped, in the pool and usable.
    fault::inject(Fault::next(DriverCall::MemUnmap));
    ensure(
        vmm.release_unused().is_err(),
        "release ignored a failed unmap",
    )?;
    fault::reset();
    // The first chunk (with `keep`) and the mapping whose unmap failed stay, one after the
    // other (growth may have mapped the 128 MiB as one mapping or two): a block across them is
    // served without growing.
    let mapped = vmm.pool_size();
    ensure(
        mapped == 2 * chunk || mapped == 3 * chunk,
        format!("{mapped} bytes mapped, expected the kept chunk and the failed mapping"),
    )?;
    let q = vmm.allocate(legacy(), chunk, 256)?;
    ensure(vmm.pool_size() == mapped, "the kept chunk was not reused")?;
    fill(q, chunk, 0x5afe, legacy())?;
    holds(q, chunk, 0x5afe, legacy())?;
    free(&vmm, q, chunk)?;
    ensure(
        vmm.release_unused()? > 0,
        "nothing released after the fault",
    )?;
    free(&vmm, keep, MIB)
}

/// Construction refuses what it cannot do with a typed error.
fn construction_errors_are_typed() -> Result<(), Failed> {
    let win32 = VmmPoolOptions::new(GIB).export_handle_type(AllocationHandleType::Win32);
    match VmmPoolMemoryResource::with_options(win32) {
        Err(MrError::Unsupported(_)) => {}
        other => return Err(format!("a Win32 export handle: {other:?}").into()),
    }
    let odd = VmmPoolOptions::new(GIB).granularity(3 * 256);
    match VmmPoolMemoryResource::with_options(odd) {
        Err(MrError::InvalidArgument(_)) => {}
        other => return Err(format!("a granularity of 768 bytes: {other:?}").into()),
    }
    match VmmPoolMemoryResource::new(MIB) {
        Err(MrError::InvalidArgument(_)) => {}
        other => return Err(format!("a maximum below the granularity: {other:?}").into()),
    }
    let pool = VmmPoolMemoryResource::new(GIB)?;
    ensure(pool.device() == Some(rmm_sys::current_device()?), "device")?;
    ensure(
        pool.properties().device_accessible && !pool.properties().host_accessible,
        "properties",
    )?;
    let e = pool.allocate(legacy(), GIB + 1, 256).unwrap_err();
    ensure(e.is_out_of_memory(), format!("{e}"))
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let trials = vec![
        gpu_if("issue_1957", no_vmm, issue_1957),
        gpu_if("issue_496", no_vmm, issue_496),
        gpu_if("multi_stream_workload", no_vmm, multi_stream_workload),
        gpu_if(
            "blocks_span_chunks_and_hold_data",
            no_vmm,
            blocks_span_chunks_and_hold_data,
        ),
        gpu_if(
            "release_unused_returns_memory",
            no_vmm,
            release_unused_returns_memory,
        ),
        gpu_if(
            "export_chunks_map_elsewhere",
            no_fd_export,
            export_chunks_map_elsewhere,
        ),
        gpu_if("peer_access", no_second_device, peer_access),
        gpu_if(
            "driver_failures_change_nothing",
            no_vmm,
            driver_failures_change_nothing,
        ),
        gpu_if(
            "construction_errors_are_typed",
            no_vmm,
            construction_errors_are_typed,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
