//! GPU tests of rollback after failed driver calls: rmm-sys's fault injection (feature
//! `testing`) makes a real driver call fail at a chosen point (an allocation, a free, an event
//! record, a stream wait, a prefetch), and each trial checks that the resource is as before the
//! failed call, that the call succeeds once retried, and that nothing is left upstream at the
//! end. Without a GPU every trial reports itself ignored, with the reason. The CPU side of the
//! same checks is `fault_tests` in the library (simulated driver).

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use rmm_mr::{
    ArenaMemoryResource, ArenaOptions, CudaAsyncMemoryResource, CudaMemoryResource,
    DeviceMemoryResource, FixedSizeMemoryResource, FixedSizeOptions, ManagedMemoryResource,
    MrError, PoolMemoryResource, PrefetchResourceAdaptor, StatisticsResourceAdaptor,
};
use rmm_stream::{CudaStream, CudaStreamView, StreamFlags};
use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};
use rmm_sys::{DeviceId, ResultCode};

type Counted<U> = StatisticsResourceAdaptor<U>;

fn gpu(name: &str, f: fn() -> Result<Completion, Failed>) -> Trial {
    Trial::ignorable_test(name, move || match rmm_sys::gpu_unavailable_reason() {
        Some(why) => Ok(Completion::ignored_with(format!("needs a CUDA GPU: {why}"))),
        None => {
            let _scope = FaultScope::new();
            f()
        }
    })
}

fn ensure(cond: bool, msg: impl Into<String>) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(msg.into().into())
    }
}

/// Allocations outstanding upstream, as the statistics adaptor counts them.
fn outstanding<U: DeviceMemoryResource>(up: &Counted<U>) -> i64 {
    up.allocations_counter().value
}

fn stream() -> Result<CudaStream, Failed> {
    Ok(CudaStream::new(StreamFlags::NonBlocking)?)
}

fn done() -> Result<Completion, Failed> {
    Ok(Completion::Completed)
}

/// `cuMemAlloc` failing with out-of-memory is out-of-memory, with another code `bad_alloc`;
/// a failed `cuMemFree` leaves the memory allocated, and freeing it again works.
fn cuda_allocate_and_free() -> Result<Completion, Failed> {
    let mr = CudaMemoryResource::new();
    let s = CudaStreamView::default();
    fault::inject(Fault::next(DriverCall::Allocate));
    let e = mr.allocate(s, 1 << 20, 256).unwrap_err();
    ensure(e.is_out_of_memory(), format!("injected OOM: {e}"))?;
    fault::inject(Fault::next(DriverCall::Allocate).with_code(ResultCode::INVALID_VALUE));
    let e = mr.allocate(s, 1 << 20, 256).unwrap_err();
    ensure(
        matches!(e, MrError::BadAlloc { .. }),
        format!("injected INVALID_VALUE: {e}"),
    )?;
    let p = mr.allocate(s, 1 << 20, 256)?;
    fault::inject(Fault::next(DriverCall::Free));
    // SAFETY: `p` came from `mr`; the free fails and `p` stays allocated.
    let failed = unsafe { mr.deallocate(s, p, 1 << 20, 256) };
    ensure(failed.is_err(), "the free did not fail")?;
    // SAFETY: `p` is still allocated.
    unsafe { mr.deallocate(s, p, 1 << 20, 256)? };
    ensure(
        fault::injected(DriverCall::Free) == 1,
        "no free fault fired",
    )?;
    done()
}

/// A failed `cuMemFreeAsync` under statistics: the counters are taken back and the retried free
/// works.
fn async_free() -> Result<Completion, Failed> {
    let mr = StatisticsResourceAdaptor::new(CudaAsyncMemoryResource::new()?);
    let s = stream()?;
    let p = mr.allocate(s.view(), 4096, 256)?;
    let before = mr.counters();
    fault::inject(Fault::next(DriverCall::Free));
    // SAFETY: `p` came from `mr` on `s`; the free fails and `p` stays allocated.
    let failed = unsafe { mr.deallocate(s.view(), p, 4096, 256) };
    ensure(failed.is_err(), "the free did not fail")?;
    ensure(mr.counters() == before, "the failed free was counted")?;
    // SAFETY: `p` is still allocated.
    unsafe { mr.deallocate(s.view(), p, 4096, 256)? };
    s.synchronize()?;
    ensure(outstanding(&mr) == 0, "an allocation is left")?;
    done()
}

/// A stream that takes blocks from the legacy stream's list creates, records and waits on that
/// list's event: each of the three failing makes the allocation fail with nothing taken, and
/// without faults the steal works (the resource does not grow).
fn steal_faults<R: DeviceMemoryResource>(mr: &R, size: impl Fn(&R) -> usize) -> Result<(), Failed> {
    let s = stream()?;
    // Blocks in the legacy list, freed there.
    let warm = mr.allocate(CudaStreamView::legacy(), 4096, 256)?;
    // SAFETY: `warm` came from `mr` on the legacy stream.
    unsafe { mr.deallocate(CudaStreamView::legacy(), warm, 4096, 256)? };
    let grown = size(mr);
    for call in [
        DriverCall::EventCreate,
        DriverCall::EventRecord,
        DriverCall::StreamWait,
    ] {
        fault::inject(Fault::next(call));
        let r = mr.allocate(s.view(), 4096, 256);
        fault::disarm(call);
        if fault::injected(call) == 0 {
            // The event already existed (created on the legacy list's first steal).
            if let Ok(p) = r {
                // SAFETY: `p` came from `mr` on `s`.
                unsafe { mr.deallocate(s.view(), p, 4096, 256)? };
            }
            continue;
        }
        ensure(
            r.is_err(),
            format!("{call:?} failed, yet the steal succeeded"),
        )?;
        ensure(size(mr) == grown, format!("{call:?}: the resource grew"))?;
    }
    let p = mr.allocate(s.view(), 4096, 256)?;
    ensure(size(mr) == grown, "grew instead of stealing")?;
    s.synchronize()?;
    // SAFETY: `p` came from `mr` on `s`.
    unsafe { mr.deallocate(s.view(), p, 4096, 256)? };
    s.synchronize()?;
    Ok(())
}

fn pool_steal() -> Result<Completion, Failed> {
    let up = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    let pool = PoolMemoryResource::new(up.clone(), 1 << 20)?;
    steal_faults(&pool, PoolMemoryResource::pool_size)?;
    ensure(
        pool.outstanding_allocations() == 0,
        "a block is still handed out",
    )?;
    drop(pool);
    ensure(outstanding(&up) == 0, "a chunk is left upstream")?;
    done()
}

fn fixed_size_steal() -> Result<Completion, Failed> {
    let up = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    let fixed = FixedSizeMemoryResource::with_options(
        up.clone(),
        FixedSizeOptions::new()
            .block_size(1 << 16)
            .blocks_to_preallocate(16),
    )?;
    steal_faults(&fixed, FixedSizeMemoryResource::pool_size)?;
    ensure(
        fixed.outstanding_allocations() == 0,
        "a block is still handed out",
    )?;
    drop(fixed);
    ensure(outstanding(&up) == 0, "a chunk is left upstream")?;
    done()
}

/// The arena: a free on another stream than the allocation's records a fence there; that
/// record failing fails the free and changes nothing (the memory dump is the same), and the
/// retried free works. The allocating stream's next allocation waits on the fence; that wait
/// failing fails the allocation, and the retry works.
fn arena_fences() -> Result<Completion, Failed> {
    let up = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    let arena =
        ArenaMemoryResource::with_options(up.clone(), ArenaOptions::new().arena_size(64 << 20))?;
    let (s1, s2) = (stream()?, stream()?);
    let a = arena.allocate(s1.view(), 4096, 256)?;
    let b = arena.allocate(s1.view(), 4096, 256)?;
    let dump = arena.memory_dump();
    fault::inject(Fault::next(DriverCall::EventRecord));
    // SAFETY: `a` came from `arena`; the free fails and `a` stays allocated.
    let r = unsafe { arena.deallocate(s2.view(), a, 4096, 256) };
    ensure(
        r.is_err(),
        "the fence record failed, yet the free succeeded",
    )?;
    ensure(
        arena.memory_dump() == dump,
        "the failed free changed the arena",
    )?;
    // SAFETY: `a` is still allocated.
    unsafe { arena.deallocate(s2.view(), a, 4096, 256)? };
    fault::inject(Fault::next(DriverCall::StreamWait));
    let r = arena.allocate(s1.view(), 4096, 256);
    ensure(
        r.is_err(),
        "the fence wait failed, yet the allocation succeeded",
    )?;
    let c = arena.allocate(s1.view(), 4096, 256)?;
    s1.synchronize()?;
    // SAFETY: `b` and `c` came from `arena` on `s1`.
    unsafe {
        arena.deallocate(s1.view(), b, 4096, 256)?;
        arena.deallocate(s1.view(), c, 4096, 256)?;
    }
    s1.synchronize()?;
    s2.synchronize()?;
    drop(arena);
    ensure(outstanding(&up) == 0, "the arena is left upstream")?;
    done()
}

/// The prefetch adaptor over managed memory: a failed prefetch gives the allocation back.
fn prefetch() -> Result<Completion, Failed> {
    let device = DeviceId::current()?;
    if !device.capabilities()?.concurrent_managed_access {
        return Ok(Completion::ignored_with(
            "needs concurrent managed access (nothing is prefetched without it)",
        ));
    }
    let counted = StatisticsResourceAdaptor::new(ManagedMemoryResource::new());
    let mr = PrefetchResourceAdaptor::new(counted.clone());
    let s = stream()?;
    fault::inject(Fault::next(DriverCall::Prefetch));
    ensure(
        mr.allocate(s.view(), 1 << 20, 256).is_err(),
        "the prefetch did not fail",
    )?;
    ensure(
        fault::injected(DriverCall::Prefetch) == 1,
        "no prefetch was made",
    )?;
    ensure(outstanding(&counted) == 0, "the allocation was kept")?;
    let p = mr.allocate(s.view(), 1 << 20, 256)?;
    s.synchronize()?;
    // SAFETY: `p` came from `mr` on `s`.
    unsafe { mr.deallocate(s.view(), p, 1 << 20, 256)? };
    ensure(outstanding(&counted) == 0, "an allocation is left")?;
    done()
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let trials = vec![
        gpu("faults/cuda/allocate_and_free", cuda_allocate_and_free),
        gpu("faults/cuda_async/free", async_free),
        gpu("faults/pool/steal", pool_steal),
        gpu("faults/fixed_size/steal", fixed_size_steal),
        gpu("faults/arena/fences", arena_fences),
        gpu("faults/prefetch/managed", prefetch),
    ];
    libtest_mimic::run(&args, trials).exit();
}
