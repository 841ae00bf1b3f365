//! RMM's conformance suite instantiated for every base resource, the sub-allocators (the VMM
//! pool included) and the limiting adaptor.
//! Run by the GPU bundle in both default-stream modes; without a GPU every trial is ignored.

mod conformance;

use std::sync::Arc;

use conformance::{trials, Subject, GIB};
use libtest_mimic::Arguments;
use rmm_mr::{
    ArenaMemoryResource, BinningMemoryResource, BinningOptions, CallbackMemoryResource,
    CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource, CudaAsyncViewMemoryResource,
    CudaMemoryResource, DeviceMemoryResource, FixedSizeMemoryResource, LimitingResourceAdaptor,
    ManagedMemoryResource, PinnedHostMemoryResource, PoolMemoryResource, SamHeadroomMemoryResource,
    SharedResource, SystemMemoryResource, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_sys::testing::{self, no_pools, no_vmm};
use rmm_sys::{DeviceCapabilities, DriverVersion};

fn caps() -> Option<DeviceCapabilities> {
    testing::caps().ok()
}

fn no_sam() -> Option<String> {
    match caps() {
        Some(c) if c.pageable_memory_access => None,
        _ => Some("the device lacks pageable memory access (HMM/ATS)".into()),
    }
}

fn no_async_managed() -> Option<String> {
    let v = rmm_sys::driver_version().ok()?;
    if v < DriverVersion::CUDA_13_0 {
        return Some(format!("needs a CUDA 13 driver, found {v}"));
    }
    match caps() {
        Some(c) if c.concurrent_managed_access => None,
        _ => Some("the device lacks concurrent managed access".into()),
    }
}

fn arc<R: DeviceMemoryResource>(r: R) -> SharedResource {
    Arc::new(r)
}

fn subjects() -> Vec<Subject> {
    vec![
        Subject::new("cuda", || Ok(arc(CudaMemoryResource::new()))),
        Subject::new("managed", || Ok(arc(ManagedMemoryResource::new()))).without_oversize(),
        Subject::new("cuda_async", || Ok(arc(CudaAsyncMemoryResource::new()?)))
            .unsupported_when(no_pools),
        Subject::new("cuda_async_view", || {
            Ok(arc(CudaAsyncViewMemoryResource::default_device_pool()?))
        })
        .unsupported_when(no_pools),
        // A view whose owning resource value is dropped at once: the view's shared ownership
        // alone keeps the pool alive through the whole suite.
        Subject::new("cuda_async_view_of_dropped_owner", || {
            Ok(arc(CudaAsyncMemoryResource::new()?.view()))
        })
        .unsupported_when(no_pools),
        Subject::new("cuda_async_managed", || {
            Ok(arc(CudaAsyncManagedMemoryResource::new()?))
        })
        .unsupported_when(no_async_managed)
        .without_oversize(),
        Subject::new("pinned_host", || Ok(arc(PinnedHostMemoryResource::new()))).without_mt(),
        Subject::new("system", || Ok(arc(SystemMemoryResource::new()?)))
            .unsupported_when(no_sam)
            .without_mt(),
        Subject::new("sam_headroom", || {
            Ok(arc(SamHeadroomMemoryResource::new(GIB)?))
        })
        .unsupported_when(no_sam)
        .without_mt(),
        Subject::new("callback", || {
            let up = CudaMemoryResource::new();
            let alloc = move |bytes: usize, stream: rmm_stream::CudaStreamView<'_>| {
                up.allocate(stream, bytes, 256)
            };
            let free = move |ptr: rmm_sys::DevicePtr,
                             bytes: usize,
                             stream: rmm_stream::CudaStreamView<'_>| {
                // SAFETY: the callback resource hands back only what its allocate callback
                // returned, with the same size.
                unsafe { up.deallocate(stream, ptr, bytes, 256) }
            };
            // SAFETY: the closures forward to a CUDA resource, which keeps the contract.
            Ok(arc(unsafe { CallbackMemoryResource::new(alloc, free) }))
        }),
        // 2 GiB: the multithreaded cases hold up to 4 x 100 random allocations of up to 5 MiB
        // at once (1,070 MiB with their seeds), so a 1 GiB limit made them fail whenever the
        // four threads overlapped fully.
        Subject::new("limiting", || {
            Ok(arc(LimitingResourceAdaptor::new(
                CudaMemoryResource::new(),
                2 * GIB,
            )))
        }),
        Subject::new("limiting_over_shared_async", || {
            let up: SharedResource = arc(CudaAsyncMemoryResource::new()?);
            Ok(arc(LimitingResourceAdaptor::new(up, 4 * GIB)))
        })
        .unsupported_when(no_pools),
        // Sub-allocators, over a CUDA upstream and over the driver's pool (RMM's matrix plus the
        // async upstream).
        Subject::new("pool_over_cuda", || {
            Ok(arc(PoolMemoryResource::new(CudaMemoryResource::new(), 0)?))
        }),
        Subject::new("pool_over_async", || {
            Ok(arc(PoolMemoryResource::new(
                CudaAsyncMemoryResource::new()?,
                0,
            )?))
        })
        .unsupported_when(no_pools),
        Subject::new("pool_over_pinned_host", || {
            Ok(arc(PoolMemoryResource::new(
                PinnedHostMemoryResource::new(),
                0,
            )?))
        })
        .without_mt(),
        // The VMM pool: nothing mapped up front, and 64 MiB mapped up front in 32 MiB chunks.
        Subject::new("vmm_pool", || Ok(arc(VmmPoolMemoryResource::new(4 * GIB)?)))
            .unsupported_when(no_vmm),
        Subject::new("vmm_pool_initial_coarse", || {
            Ok(arc(VmmPoolMemoryResource::with_options(
                VmmPoolOptions::new(4 * GIB)
                    .initial_pool_size(64 << 20)
                    .granularity(32 << 20),
            )?))
        })
        .unsupported_when(no_vmm),
        Subject::new("fixed_size_over_cuda", || {
            Ok(arc(
                FixedSizeMemoryResource::new(CudaMemoryResource::new())?,
            ))
        })
        .without_allocation_suite()
        .without_mt(),
        Subject::new("fixed_size_over_async", || {
            Ok(arc(FixedSizeMemoryResource::new(
                CudaAsyncMemoryResource::new()?,
            )?))
        })
        .unsupported_when(no_pools)
        .without_allocation_suite()
        .without_mt(),
        Subject::new("binning_over_cuda", || {
            Ok(arc(BinningMemoryResource::with_options(
                CudaMemoryResource::new(),
                BinningOptions::new()
                    .min_size_exponent(18)
                    .max_size_exponent(22),
            )?))
        }),
        Subject::new("binning_over_async", || {
            Ok(arc(BinningMemoryResource::with_options(
                CudaAsyncMemoryResource::new()?,
                BinningOptions::new()
                    .min_size_exponent(18)
                    .max_size_exponent(22),
            )?))
        })
        .unsupported_when(no_pools),
        Subject::new("arena_over_cuda", || {
            Ok(arc(ArenaMemoryResource::new(CudaMemoryResource::new())?))
        }),
        Subject::new("arena_over_async", || {
            Ok(arc(ArenaMemoryResource::new(
                CudaAsyncMemoryResource::new()?,
            )?))
        })
        .unsupported_when(no_pools),
    ]
}

fn main() {
    let args = Arguments::from_args();
    let trials = subjects().iter().flat_map(trials).collect();
    libtest_mimic::run(&args, trials).exit();
}
