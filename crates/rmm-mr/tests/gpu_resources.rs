//! Resource-specific GPU cases (RMM's per-file tests, section 3.3 of the reference) for the base
//! resources, the limiting adaptor, prefetch and the registry, and the driver pools' frees across
//! threads on the per-thread default stream (`cross_thread_free/...`, see `cross_thread/mod.rs`).
//! Without a GPU every trial is ignored, with the reason.

mod conformance;
mod cross_thread;

use std::sync::Arc;

use conformance::{ensure, MIB};
use libtest_mimic::{Arguments, Completion, Failed};
use rmm_mr::{
    per_device_resource, prefetch, reset_current_device_resource, resource_cast,
    set_current_device_resource, CallbackMemoryResource, CudaAsyncManagedMemoryResource,
    CudaAsyncMemoryResource, CudaAsyncOptions, CudaAsyncViewMemoryResource, CudaMemoryResource,
    DeviceMemoryResource, LimitingResourceAdaptor, ManagedMemoryResource, MrError, PrefetchTarget,
    SamHeadroomMemoryResource, SharedResource, SystemMemoryResource,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::testing::{caps, done, gpu_if, gpu_outcome as gpu, no_pools};
use rmm_sys::{memory, AllocationHandleType, DeviceId, DriverVersion};

// --- the registry (mr_ref_default_tests.cpp) ----------------------------------------------

fn default_resource_is_cuda() -> Result<Completion, Failed> {
    reset_current_device_resource()?;
    let r = rmm_mr::current_device_resource()?;
    ensure(
        resource_cast::<CudaMemoryResource>(&*r).is_some(),
        "initial resource is not cuda",
    )?;
    let p = r.allocate_sync(MIB, 256)?;
    // SAFETY: `p` came from `r`.
    unsafe { r.deallocate_sync(p, MIB, 256)? };
    let seen: Vec<bool> = std::thread::scope(|s| {
        (0..4)
            .map(|_| {
                s.spawn(|| {
                    rmm_mr::current_device_resource()
                        .map(|r| r.is_equal(&CudaMemoryResource::new()))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect::<Result<_, _>>()
    })?;
    ensure(
        seen.iter().all(|&b| b),
        "a thread saw a non-cuda initial resource",
    )?;
    done()
}

fn replaced_resource_keeps_old_memory_valid() -> Result<Completion, Failed> {
    let old: SharedResource = Arc::new(CudaAsyncMemoryResource::new()?);
    set_current_device_resource(Arc::clone(&old))?;
    let held = rmm_mr::current_device_resource()?;
    let p = held.allocate(CudaStreamView::default(), MIB, 256)?;
    drop(old);
    set_current_device_resource(Arc::new(ManagedMemoryResource::new()))?;
    // SAFETY: `p` came from `held`; the async pool is kept alive by `held`.
    unsafe { held.deallocate(CudaStreamView::default(), p, MIB, 256)? };
    CudaStreamView::default().synchronize()?;
    reset_current_device_resource()?;
    ensure(
        per_device_resource(rmm_sys::current_device()?).is_equal(&CudaMemoryResource::new()),
        "reset did not restore cuda",
    )?;
    done()
}

// --- errors ----------------------------------------------------------------------------------

fn error_taxonomy() -> Result<Completion, Failed> {
    let mr = CudaMemoryResource::new();
    let s = CudaStreamView::default();
    ensure(
        mr.allocate(s, 1 << 50, 256).unwrap_err().is_out_of_memory(),
        "1 PiB",
    )?;
    ensure(
        mr.allocate(s, usize::MAX, 256)
            .unwrap_err()
            .is_out_of_memory(),
        "usize::MAX",
    )?;
    ensure(
        matches!(mr.allocate(s, 1024, 512), Err(MrError::BadAlloc { .. })),
        "512 alignment",
    )?;
    ensure(
        matches!(mr.allocate(s, 1024, 3), Err(MrError::BadAlloc { .. })),
        "alignment 3",
    )?;
    ensure(mr.allocate(s, 0, 256)?.is_null(), "0 bytes")?;
    // SAFETY: null is a no-op.
    unsafe { mr.deallocate(s, rmm_sys::DevicePtr::NULL, 0, 256)? };
    let bogus = rmm_sys::DevicePtr::from_raw(0xdead_0000);
    // SAFETY: the driver rejects an address it never handed out; nothing is freed.
    let e = unsafe { mr.deallocate(s, bogus, 256, 256) }.unwrap_err();
    ensure(
        matches!(e, MrError::InvalidFree { .. }),
        format!("bogus free: {e}"),
    )?;
    done()
}

// --- cuda_async (cuda_async_mr_tests.cpp) ------------------------------------------------------

fn async_thresholds_and_priming() -> Result<Completion, Failed> {
    if !caps()?.memory_pools_supported {
        return Ok(Completion::ignored_with("no memory pools"));
    }
    let mr = CudaAsyncMemoryResource::new()?;
    ensure(
        mr.release_threshold()? == u64::MAX,
        "default threshold is not u64::MAX",
    )?;
    let primed = CudaAsyncMemoryResource::with_options(
        CudaAsyncOptions::new()
            .initial_pool_size(100 * MIB)
            .release_threshold(1000 * MIB as u64),
    )?;
    ensure(
        primed.release_threshold()? == 1000 * MIB as u64,
        "explicit threshold not applied",
    )?;
    let st = primed.statistics()?;
    ensure(
        st.reserved_current >= 100 * MIB as u64,
        format!("priming reserved {}", st.reserved_current),
    )?;
    ensure(st.used_current == 0, "primed pool has used memory")?;
    ensure(!mr.is_equal(&primed), "two pools compare equal")?;
    ensure(mr.is_equal(&mr.clone()), "copies unequal")?;
    // trim_to and live statistics.
    let s = CudaStreamView::default();
    let p = primed.allocate(s, 10 * MIB, 256)?;
    ensure(
        primed.statistics()?.used_current >= 10 * MIB as u64,
        "used not counted",
    )?;
    // SAFETY: `p` came from `primed`.
    unsafe { primed.deallocate(s, p, 10 * MIB, 256)? };
    s.synchronize()?;
    primed.trim_to(0)?;
    ensure(
        primed.statistics()?.reserved_current == 0,
        "trim_to(0) kept memory",
    )?;
    done()
}

/// RMM's `HWDecompressTest`: from CUDA 12.8 the async resource's pool is made with the
/// hardware-decompression usage, so its memory may serve the decompression engine exactly
/// where `cuMemAlloc`'s may (a pool without the usage reports false where `cuMemAlloc`'s
/// reports true).
fn async_hw_decompress_like_cuda() -> Result<Completion, Failed> {
    if !caps()?.memory_pools_supported {
        return Ok(Completion::ignored_with("no memory pools"));
    }
    let driver = rmm_sys::driver_version()?;
    if driver < DriverVersion::CUDA_12_8 {
        return Ok(Completion::ignored_with(format!(
            "driver CUDA {driver}: no hardware decompression before 12.8"
        )));
    }
    let s = CudaStreamView::default();
    let cuda = CudaMemoryResource::new();
    let mr = CudaAsyncMemoryResource::new()?;
    let (a, b) = (cuda.allocate(s, 100, 256)?, mr.allocate(s, 100, 256)?);
    let capable = (
        memory::pointer_is_hw_decompress_capable(a),
        memory::pointer_is_hw_decompress_capable(b),
    );
    // SAFETY: each pointer came from its resource with these sizes and is freed once.
    unsafe {
        mr.deallocate(s, b, 100, 256)?;
        cuda.deallocate(s, a, 100, 256)?;
    }
    s.synchronize()?;
    let (cuda_capable, async_capable) = (capable.0?, capable.1?);
    ensure(
        async_capable == cuda_capable,
        format!(
            "cuMemAlloc memory decompress-capable: {cuda_capable}, the async resource's: \
             {async_capable}"
        ),
    )?;
    if !cuda_capable {
        return Ok(Completion::ignored_with(
            "this device reports no memory decompress-capable (compared, both false)",
        ));
    }
    done()
}

fn async_fabric_handles() -> Result<Completion, Failed> {
    let c = caps()?;
    if !c.supports_handle_type(AllocationHandleType::Fabric) {
        let e = CudaAsyncMemoryResource::with_options(
            CudaAsyncOptions::new().export_handle_type(AllocationHandleType::Fabric),
        )
        .unwrap_err();
        ensure(
            matches!(&e, MrError::Unsupported(m) if m.contains("Fabric")),
            format!("unsupported fabric: {e:?}"),
        )?;
        return Ok(Completion::ignored_with(
            "fabric handles unsupported (checked the error)",
        ));
    }
    let mr = CudaAsyncMemoryResource::with_options(
        CudaAsyncOptions::new().export_handle_type(AllocationHandleType::Fabric),
    )?;
    let p = mr.allocate_sync(MIB, 256)?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate_sync(p, MIB, 256)? };
    done()
}

fn async_posix_fd_handles() -> Result<Completion, Failed> {
    if !caps()?.supports_handle_type(AllocationHandleType::PosixFileDescriptor) {
        return Ok(Completion::ignored_with("POSIX fd handles unsupported"));
    }
    let mr = CudaAsyncMemoryResource::with_options(
        CudaAsyncOptions::new().export_handle_type(AllocationHandleType::PosixFileDescriptor),
    )?;
    let p = mr.allocate_sync(MIB, 256)?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate_sync(p, MIB, 256)? };
    done()
}

// --- cuda_async_view ---------------------------------------------------------------------------

fn async_view_does_not_own_the_pool() -> Result<Completion, Failed> {
    // SAFETY: a null handle is refused before it is used.
    let null = unsafe {
        CudaAsyncViewMemoryResource::new(rmm_sys::MemPoolHandle::from_raw(std::ptr::null_mut()))
    };
    ensure(
        matches!(null, Err(MrError::InvalidArgument(_))),
        "null pool accepted",
    )?;
    let pool =
        rmm_sys::mempool::mem_pool_create(rmm_sys::current_device()?, AllocationHandleType::None)?;
    {
        // SAFETY: the pool was created above and is destroyed only after both views are gone.
        let (view, other) = unsafe {
            (
                CudaAsyncViewMemoryResource::new(pool)?,
                CudaAsyncViewMemoryResource::new(pool)?,
            )
        };
        let p = view.allocate_sync(MIB, 256)?;
        ensure(view.statistics()?.used_current >= MIB as u64, "view stats")?;
        // SAFETY: `p` came from `view`.
        unsafe { view.deallocate_sync(p, MIB, 256)? };
        ensure(view.is_equal(&other), "views of one pool unequal")?;
    }
    // The views are gone; the pool is still ours to destroy.
    // SAFETY: the pool was created above and nothing uses it.
    unsafe { rmm_sys::mempool::mem_pool_destroy(pool)? };
    let default = CudaAsyncViewMemoryResource::default_device_pool()?;
    let p = default.allocate_sync(4 * MIB, 256)?;
    // SAFETY: `p` came from `default`.
    unsafe { default.deallocate_sync(p, 4 * MIB, 256)? };
    // Nothing in this process replaced the device's current pool, so it is the default one.
    // SAFETY: the current pool is the device's default pool (checked just below, before any
    // allocation), which the driver never destroys.
    let current = unsafe { CudaAsyncViewMemoryResource::current_device_pool()? };
    ensure(
        current.is_equal(&default) && current.pool_handle() == default.pool_handle(),
        "the current pool is not the default pool",
    )?;
    done()
}

/// A view made with the safe constructor shares ownership of the pool: it keeps allocating,
/// reading statistics and freeing after the owning resource value is dropped, and the pool is
/// destroyed (its memory given back to the device) once the last view is dropped.
fn async_view_keeps_the_owner_alive() -> Result<Completion, Failed> {
    const RESERVE: usize = 512 * MIB;
    let mr =
        CudaAsyncMemoryResource::with_options(CudaAsyncOptions::new().release_threshold(u64::MAX))?;
    let pool = mr.pool_handle();
    let view = mr.view();
    let same = CudaAsyncViewMemoryResource::of(&mr);
    ensure(
        view.pool_handle() == pool && same.pool_handle() == pool,
        "a view of the resource views another pool",
    )?;
    ensure(view.is_equal(&same), "two views of one pool unequal")?;
    // Memory from the owner, freed through the view after the owner is gone.
    let p = mr.allocate_sync(MIB, 256)?;
    drop(mr);
    drop(same);

    let q = view.allocate_sync(RESERVE, 256)?;
    let stream = CudaStream::non_blocking()?;
    // SAFETY: `q` is `RESERVE` bytes the view just handed out; written and read on `stream`.
    unsafe {
        memory::memset_d32_async(q, 0x1234_5678, RESERVE / 4, stream.value())?;
        let mut back = [0u8; 8];
        memory::copy_to_host_sync(&mut back, q, stream.value())?;
        ensure(
            back == [0x1234_5678u32.to_ne_bytes(), 0x1234_5678u32.to_ne_bytes()].concat()[..],
            "memory from the view does not hold what was written",
        )?;
    }
    let stats = view.statistics()?;
    ensure(
        stats.used_current >= (RESERVE + MIB) as u64,
        format!("used {} after the owner was dropped", stats.used_current),
    )?;
    // SAFETY: `q` came from the view and `p` from the resource whose pool the view shares;
    // the work on `stream` using `q` has completed (synchronized copy).
    unsafe {
        view.deallocate_sync(q, RESERVE, 256)?;
        view.deallocate_sync(p, MIB, 256)?;
    }
    let stats = view.statistics()?;
    ensure(
        stats.used_current == 0 && stats.reserved_current >= RESERVE as u64,
        format!("after the frees: {stats:?} (threshold u64::MAX keeps memory reserved)"),
    )?;

    // A clone shares the ownership too.
    let clone = view.clone();
    drop(view);
    let r = clone.allocate_sync(MIB, 256)?;
    // SAFETY: `r` came from `clone`.
    unsafe { clone.deallocate_sync(r, MIB, 256)? };
    rmm_sys::device_synchronize()?;

    // Dropping the last owner destroys the pool, which gives its reserved memory back.
    let (free_before, _) = rmm_sys::available_device_memory()?;
    drop(clone);
    let (free_after, _) = rmm_sys::available_device_memory()?;
    ensure(
        free_after >= free_before + RESERVE / 2,
        format!(
            "dropping the last view did not release the pool: free {free_before} -> {free_after}"
        ),
    )?;
    done()
}

// --- cuda_async_managed (cuda_async_managed_mr_tests.cpp) ------------------------------------

fn async_managed() -> Result<Completion, Failed> {
    let v = rmm_sys::driver_version()?;
    if v < DriverVersion::CUDA_13_0 || !caps()?.concurrent_managed_access {
        let r = CudaAsyncManagedMemoryResource::new();
        ensure(
            matches!(r, Err(MrError::Unsupported(_))),
            format!("without support: {r:?}"),
        )?;
        return Ok(Completion::ignored_with(
            "needs CUDA 13 and concurrent managed access (checked the error)",
        ));
    }
    let a = CudaAsyncManagedMemoryResource::new()?;
    let b = CudaAsyncManagedMemoryResource::new()?;
    ensure(
        a.is_equal(&b),
        "two instances on the default managed pool are unequal",
    )?;
    ensure(a.properties().host_accessible, "not host accessible")?;
    let s = CudaStream::non_blocking()?;
    let mut ptrs = Vec::new();
    for i in 0..8usize {
        let bytes = (i + 1) * 4096;
        let p = a.allocate(s.view(), bytes, 256)?;
        ensure(memory::pointer_is_managed(p)?, "pointer not managed")?;
        ptrs.push((p, bytes));
    }
    s.synchronize()?;
    for &(p, bytes) in &ptrs {
        // SAFETY: managed memory of `bytes` bytes, synchronized, accessible from the host.
        unsafe {
            std::ptr::write_bytes(p.as_host_ptr::<u8>(), 0xab, bytes);
            ensure(
                *p.as_host_ptr::<u8>().add(bytes - 1) == 0xab,
                "host write not read back",
            )?;
        }
    }
    for (p, bytes) in ptrs {
        // SAFETY: each came from `a` with this size.
        unsafe { a.deallocate(s.view(), p, bytes, 256)? };
    }
    s.synchronize()?;
    done()
}

// --- frees across threads on the per-thread default stream ------------------------------------

/// The driver-pool resources of the cross-thread trials.
#[derive(Debug, Clone, Copy)]
enum DriverPool {
    /// `CudaAsyncMemoryResource`: a pool of its own.
    Owned,
    /// `CudaAsyncViewMemoryResource`: a view of the device's default pool.
    View,
    /// `CudaAsyncManagedMemoryResource`: the default managed pool (CUDA 13).
    Managed,
}

impl DriverPool {
    const ALL: [Self; 3] = [Self::Owned, Self::View, Self::Managed];

    fn name(self) -> &'static str {
        match self {
            Self::Owned => "cuda_async",
            Self::View => "cuda_async_view",
            Self::Managed => "cuda_async_managed",
        }
    }

    /// What the resource needs that this machine may lack.
    fn unmet(self) -> Option<String> {
        no_pools().or_else(|| match self {
            Self::Managed => async_managed_unmet(),
            Self::Owned | Self::View => None,
        })
    }

    fn make(self) -> Result<Box<dyn DeviceMemoryResource>, Failed> {
        Ok(match self {
            Self::Owned => Box::new(CudaAsyncMemoryResource::new()?),
            Self::View => Box::new(CudaAsyncViewMemoryResource::default_device_pool()?),
            Self::Managed => Box::new(CudaAsyncManagedMemoryResource::new()?),
        })
    }
}

/// Why the default managed pool cannot be used here, or `None`.
fn async_managed_unmet() -> Option<String> {
    match (rmm_sys::driver_version(), caps()) {
        (Ok(v), Ok(c)) if v >= DriverVersion::CUDA_13_0 && c.concurrent_managed_access => None,
        (Ok(_), Ok(_)) => Some("needs CUDA 13 and concurrent managed access".into()),
        (Err(e), _) => Some(format!("cannot read the driver version: {e}")),
        (_, Err(e)) => Some(format!("cannot probe the device: {e:?}")),
    }
}

/// Thread 1 allocates on its per-thread stream and queues work on the block behind a stall;
/// thread 2 frees it on its own per-thread stream, reallocates the same size there and writes
/// (see `cross_thread/mod.rs`). The driver hands a block freed on a stream to that stream's
/// next allocation at once, so without the resource's ordering thread 2 gets the block back
/// while thread 1's work is still stalled, and the word checks fail.
fn driver_pool_cross_thread_free(
    subject: DriverPool,
    stream: cross_thread::PtStream,
    pending: cross_thread::Pending,
) -> Result<(), Failed> {
    let r = subject.make()?;
    cross_thread::run(&*r, MIB, stream, pending, cross_thread::Reuse::Any, &|_| {
        Ok(Vec::new())
    })
}

// --- system ------------------------------------------------------------------------------------

fn system_throws_if_unsupported() -> Result<Completion, Failed> {
    let supported = caps()?.pageable_memory_access;
    let r = SystemMemoryResource::new();
    if supported {
        ensure(r.is_ok(), "supported device refused")?;
        done()
    } else {
        ensure(
            matches!(r, Err(MrError::Unsupported(_))),
            "unsupported device accepted",
        )?;
        Ok(Completion::ignored_with(
            "no pageable memory access here (checked the error)",
        ))
    }
}

/// A capability really absent (pageable memory access, HMM or ATS, which x86 H100 and H200
/// servers usually lack): both system resources refuse with `Unsupported`, naming it, and the
/// device's own memory still works. Ignored, with the reason, where the capability is present.
fn system_unsupported_without_pageable_memory_access() -> Result<Completion, Failed> {
    if caps()?.pageable_memory_access {
        return Ok(Completion::ignored_with(
            "the device has pageable memory access (HMM or ATS): nothing is missing to check",
        ));
    }
    let check = |what: &str, r: Result<(), MrError>| {
        ensure(
            matches!(&r, Err(MrError::Unsupported(m)) if m.contains("pageable memory access")),
            format!("{what} without pageable memory access: {r:?}"),
        )
    };
    check("system", SystemMemoryResource::new().map(drop))?;
    check(
        "sam_headroom",
        SamHeadroomMemoryResource::new(MIB).map(drop),
    )?;
    let cuda = CudaMemoryResource::new();
    let p = cuda.allocate_sync(MIB, 256)?;
    // SAFETY: `p` came from `cuda` with this size.
    unsafe { cuda.deallocate_sync(p, MIB, 256)? };
    done()
}

// --- limiting (limiting_mr_tests.cpp) --------------------------------------------------------

fn limiting_cases() -> Result<Completion, Failed> {
    let s = CudaStreamView::default();
    let lim = LimitingResourceAdaptor::new(CudaMemoryResource::new(), 5 * MIB);
    ensure(
        lim.allocate(s, 5 * MIB + 1, 256)
            .unwrap_err()
            .is_out_of_memory(),
        "TooBig",
    )?;
    let inner = LimitingResourceAdaptor::new(lim.clone(), 2 * MIB);
    ensure(
        inner
            .allocate(s, 4 * MIB, 256)
            .unwrap_err()
            .is_out_of_memory(),
        "UpstreamFailure",
    )?;
    let a = lim.allocate(s, 2 * MIB, 256)?;
    let b = lim.allocate(s, 3 * MIB, 256)?;
    ensure(lim.allocated_bytes() == 5 * MIB, "exact limit")?;
    ensure(
        lim.allocate(s, 1, 256).unwrap_err().is_out_of_memory(),
        "OverLimit",
    )?;
    ensure(
        lim.allocated_bytes() == 5 * MIB,
        "failed request changed the count",
    )?;
    // SAFETY: both came from `lim`.
    unsafe { lim.deallocate(s, a, 2 * MIB, 256)? };
    let c = lim.allocate(s, 2 * MIB, 256)?;
    // SAFETY: both came from `lim`.
    unsafe {
        lim.deallocate(s, b, 3 * MIB, 256)?;
        lim.deallocate(s, c, 2 * MIB, 256)?;
    }
    ensure(lim.allocated_bytes() == 0, "UnderLimitDueToFrees")?;
    done()
}

// --- callback: equality and shared ownership ---------------------------------------------------

fn callback_shared_ownership() -> Result<Completion, Failed> {
    let up = CudaMemoryResource::new();
    let alloc = move |b: usize, s: rmm_stream::CudaStreamView<'_>| up.allocate(s, b, 256);
    // SAFETY: only pointers from the allocate callback come back.
    let free = move |p: rmm_sys::DevicePtr, b: usize, s: rmm_stream::CudaStreamView<'_>| unsafe {
        up.deallocate(s, p, b, 256)
    };
    // SAFETY: the closures forward to a CUDA resource, which keeps the contract.
    let cb = unsafe { CallbackMemoryResource::new(alloc, free) };
    let copy = cb.clone();
    ensure(cb.is_equal(&copy), "copy unequal")?;
    // SAFETY: null is always a valid answer.
    let other = unsafe {
        CallbackMemoryResource::new(|_, _| Ok(rmm_sys::DevicePtr::NULL), |_, _, _| Ok(()))
    };
    ensure(!cb.is_equal(&other), "fresh instance equal")?;
    let p = cb.allocate_sync(MIB, 256)?;
    drop(cb);
    // SAFETY: allocated through a copy sharing the same closures.
    unsafe { copy.deallocate_sync(p, MIB, 256)? };
    done()
}

// --- prefetch (prefetch_tests.cpp) -------------------------------------------------------------

fn prefetch_managed_and_device() -> Result<Completion, Failed> {
    let dev = rmm_sys::current_device()?;
    let s = CudaStream::non_blocking()?;
    let managed = ManagedMemoryResource::new();
    let p = managed.allocate(s.view(), 8 * MIB, 256)?;
    prefetch(p, 8 * MIB, PrefetchTarget::Device(dev), s.view())?;
    prefetch(p, 8 * MIB, PrefetchTarget::Host, s.view())?;
    s.synchronize()?;
    // SAFETY: `p` came from `managed`.
    unsafe { managed.deallocate(s.view(), p, 8 * MIB, 256)? };
    // Not managed: a silent no-op.
    let cuda = CudaMemoryResource::new();
    let d = cuda.allocate(s.view(), MIB, 256)?;
    prefetch(d, MIB, PrefetchTarget::Device(dev), s.view())?;
    // SAFETY: `d` came from `cuda`.
    unsafe { cuda.deallocate(s.view(), d, MIB, 256)? };
    let _ = DeviceId(0);
    done()
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![
        gpu(
            "registry::default_resource_is_cuda",
            default_resource_is_cuda,
        ),
        gpu(
            "registry::replaced_resource_keeps_old_memory_valid",
            replaced_resource_keeps_old_memory_valid,
        ),
        gpu("errors::taxonomy", error_taxonomy),
        gpu(
            "cuda_async::thresholds_priming_trim_statistics",
            async_thresholds_and_priming,
        ),
        gpu(
            "cuda_async::hw_decompress_like_cuda",
            async_hw_decompress_like_cuda,
        ),
        gpu("cuda_async::fabric_handles", async_fabric_handles),
        gpu("cuda_async::posix_fd_handles", async_posix_fd_handles),
        gpu(
            "cuda_async_view::does_not_own_the_pool",
            async_view_does_not_own_the_pool,
        ),
        gpu(
            "cuda_async_view::keeps_the_owner_alive",
            async_view_keeps_the_owner_alive,
        ),
        gpu("cuda_async_managed::allocations_are_managed", async_managed),
        gpu(
            "system::throws_if_unsupported",
            system_throws_if_unsupported,
        ),
        gpu(
            "system::unsupported_without_pageable_memory_access",
            system_unsupported_without_pageable_memory_access,
        ),
        gpu("limiting::rmm_cases", limiting_cases),
        gpu("callback::shared_ownership", callback_shared_ownership),
        gpu("prefetch::managed_and_device", prefetch_managed_and_device),
    ];
    for subject in DriverPool::ALL {
        for stream in cross_thread::PtStream::ALL {
            for pending in cross_thread::Pending::ALL {
                trials.push(gpu_if(
                    format!(
                        "cross_thread_free/{}/{}/{}",
                        subject.name(),
                        stream.name(),
                        pending.name()
                    ),
                    move || stream.unavailable().or_else(|| subject.unmet()),
                    move || driver_pool_cross_thread_free(subject, stream, pending),
                ));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
