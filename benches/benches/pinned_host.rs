//! Pinned host memory: what the caching pool saves per allocation, and what pinned memory buys
//! in copy bandwidth (`cargo xtask gpu bundle`, then `run.sh bench` on the GPU machine).
//!
//! 1. Cost per allocation and free, per size: `cuMemHostAlloc` + `cuMemFreeHost` against the
//!    warm `PinnedHostPool` as a resource (`allocate` + `deallocate` on the legacy stream, which
//!    records an event) and as an allocator (`PinnedVec::reserve_exact` + drop, no event).
//!    Microseconds per pair, median of the timed pairs after one untimed.
//! 2. H2D and D2H bandwidth from pageable memory (`Vec<u8>`), pinned-pool memory (`PinnedVec`)
//!    and `cuMemHostAlloc` memory, 1 MiB-256 MiB: `cuMemcpyAsync` then a stream
//!    synchronization, GB/s (10^9 bytes per second) of the median copy.
//!
//! Arguments: `--reps N` (default 20), `--quick` (5 reps, bandwidth up to 64 MiB).

use std::time::Instant;

use rmm_benches::args::Args;
use rmm_benches::table::{ratio, size_name, Table};
use rmm_benches::{bench_main, median, BenchResult};
use rmm_mr::{DeviceMemoryResource, PinnedHostPool, PinnedVec};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::{memory, DevicePtr};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn main() {
    bench_main("pinned_host", run);
}

/// The median microseconds of `reps` runs of `f`, after one untimed.
fn time_us(
    reps: usize,
    mut f: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    f()?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        samples.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut samples))
}

fn allocation_costs(reps: usize) -> BenchResult {
    let pool = PinnedHostPool::new();
    let stream = CudaStreamView::legacy();
    let mut table = Table::new(
        &[
            "size",
            "cuMemHostAlloc + cuMemFreeHost (us)",
            "pool as resource (us)",
            "pool as allocator (us)",
            "driver / pool allocator",
        ],
        1,
    );
    for bytes in [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB] {
        let driver = time_us(reps, || {
            let p = memory::mem_host_alloc(bytes)?;
            // SAFETY: just allocated, unused.
            unsafe { memory::mem_free_host(p) }?;
            Ok(())
        })?;
        let resource = time_us(reps, || {
            let p = pool.allocate(stream, bytes, 256)?;
            // SAFETY: allocated just above, unused.
            unsafe { pool.deallocate(stream, p, bytes, 256) }?;
            Ok(())
        })?;
        let allocator = time_us(reps, || {
            let mut v: PinnedVec<u8> = pool.vec();
            v.try_reserve_exact(bytes)?;
            drop(v);
            Ok(())
        })?;
        table.row([
            size_name(bytes),
            format!("{driver:.1}"),
            format!("{resource:.2}"),
            format!("{allocator:.2}"),
            ratio(Some(driver), Some(allocator)),
        ]);
    }
    println!("\n## Cost per allocation and free\n");
    print!("{}", table.render());
    let s = pool.statistics();
    println!(
        "\npool: {} chunks, {} reserved, {} hits, {} misses",
        s.chunks,
        size_name(s.reserved_bytes),
        s.hits,
        s.misses
    );
    Ok(())
}

/// Host memory of one kind for the bandwidth table.
enum Host {
    Pageable(Vec<u8>),
    Pool(PinnedVec<u8>),
    Driver(DevicePtr),
}

impl Host {
    fn ptr(&mut self) -> DevicePtr {
        match self {
            Self::Pageable(v) => DevicePtr::from_host_ptr(v.as_mut_ptr()),
            Self::Pool(v) => DevicePtr::from_host_ptr(v.as_mut_ptr()),
            Self::Driver(p) => *p,
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Self::Driver(p) = self {
            // SAFETY: allocated by `cuMemHostAlloc` in `bandwidth`; every copy was waited for.
            let _ = unsafe { memory::mem_free_host(*p) };
        }
    }
}

/// GB/s of the median copy of `bytes` between `host` and `device` on `stream`.
fn copy_rate(
    host: DevicePtr,
    device: DevicePtr,
    bytes: usize,
    to_device: bool,
    stream: &CudaStream,
    reps: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let us = time_us(reps, || {
        let (dst, src) = if to_device {
            (device, host)
        } else {
            (host, device)
        };
        // SAFETY: both ranges hold `bytes` bytes and outlive the copy, which is waited for.
        unsafe { memory::memcpy_async(dst, src, bytes, stream.value()) }?;
        stream.synchronize()?;
        Ok(())
    })?;
    Ok(bytes as f64 / (us * 1e3))
}

fn bandwidth(reps: usize, max: usize) -> BenchResult {
    let pool = PinnedHostPool::new();
    let stream = CudaStream::non_blocking()?;
    let mut table = Table::new(
        &[
            "size",
            "H2D pageable",
            "H2D pinned pool",
            "H2D cuMemHostAlloc",
            "D2H pageable",
            "D2H pinned pool",
            "D2H cuMemHostAlloc",
        ],
        1,
    );
    let mut bytes = MIB;
    while bytes <= max {
        let device = memory::mem_alloc(bytes)?;
        let mut pooled: PinnedVec<u8> = pool.vec();
        pooled.resize(bytes, 1);
        let driver = memory::mem_host_alloc(bytes)?;
        let mut hosts = [
            Host::Pageable(vec![1u8; bytes]),
            Host::Pool(pooled),
            Host::Driver(driver),
        ];
        let mut cells = vec![size_name(bytes)];
        for to_device in [true, false] {
            for host in &mut hosts {
                let rate = copy_rate(host.ptr(), device, bytes, to_device, &stream, reps)?;
                cells.push(format!("{rate:.1}"));
            }
        }
        drop(hosts);
        // SAFETY: allocated above; every copy was waited for.
        unsafe { memory::mem_free(device) }?;
        table.row(cells);
        bytes *= 4;
    }
    println!("\n## Copy bandwidth (GB/s)\n");
    print!("{}", table.render());
    Ok(())
}

fn run(args: &Args) -> BenchResult {
    let quick = args.has("--quick");
    let reps = args.usize_or("--reps", if quick { 5 } else { 20 })?.max(1);
    allocation_costs(reps)?;
    bandwidth(reps, if quick { 64 * MIB } else { 256 * MIB })
}
