//! Out-of-memory reports on the GPU (`oom_report/<resource>`): the CUDA resource and the
//! driver pool report the device's memory, the pool its maximum and per-stream lists, the arena
//! its size. Each trial prints its report line (`oom_report: <resource>: ...`). Without a GPU
//! every trial reports itself ignored.

use libtest_mimic::{Arguments, Failed, Trial};
use rmm_mr::{
    ArenaMemoryResource, ArenaOptions, CudaAsyncMemoryResource, CudaMemoryResource,
    DeviceMemoryResource, MrError, OomReport, PoolMemoryResource, PoolOptions, Verdict,
};
use rmm_stream::CudaStream;
use rmm_sys::testing::{self, ensure, no_pools, one_at_a_time};

const MIB: usize = 1 << 20;

fn report_of(name: &str, e: &MrError) -> Result<OomReport, Failed> {
    ensure(e.is_out_of_memory(), format!("not out-of-memory: {e}"))?;
    let r = e
        .oom_report()
        .cloned()
        .ok_or_else(|| Failed::from(format!("no report: {e}")))?;
    println!("oom_report: {name}: {r}");
    Ok(r)
}

fn cuda() -> Result<(), Failed> {
    let (_, total) = rmm_sys::available_device_memory()?;
    let mr = CudaMemoryResource::new();
    let s = CudaStream::non_blocking()?;
    let e = mr.allocate(s.view(), 2 * total, 256).unwrap_err();
    let r = report_of("cuda", &e)?;
    ensure(
        r.reserved == total,
        format!("reserved {} != total {total}", r.reserved),
    )?;
    ensure(r.device_free.is_some_and(|f| f <= total), "device free")?;
    ensure(r.verdict == Verdict::Capacity, format!("{:?}", r.verdict))
}

fn cuda_async() -> Result<(), Failed> {
    let (_, total) = rmm_sys::available_device_memory()?;
    let mr = CudaAsyncMemoryResource::new()?;
    let s = CudaStream::non_blocking()?;
    let held = mr.allocate(s.view(), 64 * MIB, 256)?;
    let e = mr.allocate(s.view(), 2 * total, 256).unwrap_err();
    let r = report_of("cuda_async", &e)?;
    ensure(r.in_use >= 64 * MIB, format!("in use {}", r.in_use))?;
    ensure(r.reserved >= r.in_use, "reserved below in use")?;
    ensure(r.device_free.is_some(), "device free")?;
    ensure(r.verdict == Verdict::Capacity, format!("{:?}", r.verdict))?;
    // SAFETY: allocated above on this stream, unused.
    unsafe { mr.deallocate(s.view(), held, 64 * MIB, 256)? };
    Ok(())
}

fn pool() -> Result<(), Failed> {
    let pool = PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(32 * MIB).maximum_pool_size(64 * MIB),
    )?;
    let s = CudaStream::non_blocking()?;
    let held = pool.allocate(s.view(), 30 * MIB, 256)?;
    let e = pool.allocate(s.view(), 40 * MIB, 256).unwrap_err();
    let r = report_of("pool", &e)?;
    ensure(
        (r.requested, r.reserved, r.in_use, r.free, r.limit)
            == (40 * MIB, 32 * MIB, 30 * MIB, 2 * MIB, Some(64 * MIB)),
        format!("{r:?}"),
    )?;
    ensure(
        r.free_per_stream.len() == 1,
        format!("{:?}", r.free_per_stream),
    )?;
    ensure(r.verdict == Verdict::Limit, format!("{:?}", r.verdict))?;
    // SAFETY: allocated above on this stream, unused.
    unsafe { pool.deallocate(s.view(), held, 30 * MIB, 256)? };
    Ok(())
}

fn arena() -> Result<(), Failed> {
    let arena = ArenaMemoryResource::with_options(
        CudaMemoryResource::new(),
        ArenaOptions::new().arena_size(64 * MIB),
    )?;
    let s = CudaStream::non_blocking()?;
    let e = arena.allocate(s.view(), 128 * MIB, 256).unwrap_err();
    let r = report_of("arena", &e)?;
    ensure(r.reserved == 64 * MIB, format!("{r:?}"))?;
    ensure(r.verdict == Verdict::Limit, format!("{:?}", r.verdict))
}

fn trial(name: &str, unmet: fn() -> Option<String>, f: fn() -> Result<(), Failed>) -> Trial {
    testing::gpu_if(format!("oom_report/{name}"), unmet, move || {
        let _serial = one_at_a_time();
        f()
    })
}

fn no_need() -> Option<String> {
    None
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        trial("cuda", no_need, cuda),
        trial("cuda_async", no_pools, cuda_async),
        trial("pool", no_need, pool),
        trial("arena", no_need, arena),
    ];
    libtest_mimic::run(&args, trials).exit();
}
