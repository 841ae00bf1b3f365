//! GPU tests of pinned host memory: the caching pool's reuse ordering (a block is not handed out
//! again before the copies and streams recorded on it finished), `PinnedVec` copies through a
//! `DeviceUvector`, the allocator and resource faces, typed out-of-memory, `release`, and the
//! driver's host-located pool where the driver has it. Without a GPU every trial reports itself
//! ignored, with the reason; the runner uses one test thread.

use std::time::Duration;

use libtest_mimic::{Arguments, Failed};
use rmm_containers::DeviceUvector;
use rmm_mr::{
    CudaAsyncHostMemoryResource, DeviceMemoryResource, MrError, PinnedHostPool, PinnedPoolOptions,
    PinnedVec,
};
use rmm_stream::{stall, CudaStream, CudaStreamView};
use rmm_sys::testing::{done, ensure, gpu, gpu_outcome, ignored, Outcome};

const MIB: usize = 1 << 20;

/// A vector of `len` bytes, all `value`, from `pool`.
fn filled(pool: &PinnedHostPool, len: usize, value: u8) -> PinnedVec<u8> {
    let mut v = pool.vec();
    v.resize(len, value);
    v
}

/// A block freed while a copy into it (on `s1`) and work recorded on a second stream (`s2`) are
/// still pending is not handed out again; once `s1` completes it is still held for `s2`; once
/// both complete the same block comes back, holding what the copy wrote.
fn a_block_is_not_reused_before_its_streams_finish() -> Result<(), Failed> {
    let pool = PinnedHostPool::new();
    let s1 = CudaStream::non_blocking()?;
    let s2 = CudaStream::non_blocking()?;
    let n = 4 * MIB;
    let device = DeviceUvector::from_slice(&vec![7u8; n], CudaStreamView::default(), None)?;
    let v = filled(&pool, n, 0);
    let first = v.as_ptr() as usize;
    stall(s1.view(), Duration::from_millis(400))?;
    let transfer = device.copy_to_pinned_async(v, s1.view())?;
    ensure(
        !transfer.is_complete()?,
        "the copy behind a 400 ms stall already completed",
    )?;
    stall(s2.view(), Duration::from_millis(1200))?;
    pool.record_stream(first as *const u8, s2.view())?;
    // Dropped unfinished: the block goes back to the pool with both events.
    drop(transfer);
    let stats = pool.statistics();
    ensure(
        stats.pending_bytes == n,
        format!("pending {} bytes, expected {n}", stats.pending_bytes),
    )?;
    let other = filled(&pool, n, 1);
    ensure(
        other.as_ptr() as usize != first,
        "the block was handed out while its copy was in flight",
    )?;
    s1.synchronize()?;
    let third = filled(&pool, n, 2);
    ensure(
        third.as_ptr() as usize != first,
        "the block was handed out while the second stream's work was pending",
    )?;
    s2.synchronize()?;
    let mut again: PinnedVec<u8> = pool.vec();
    again.reserve_exact(n);
    ensure(
        again.as_ptr() as usize == first,
        format!(
            "after both streams the freed block ({first:#x}) was not reused ({:#x})",
            again.as_ptr() as usize
        ),
    )?;
    // SAFETY: u8 has no invalid values; the block's `n` bytes were written by the copy, which
    // has completed (its stream was synchronized).
    unsafe { again.set_len(n) };
    ensure(
        again.iter().all(|&b| b == 7),
        "the copy's bytes are not in the block",
    )?;
    let s = pool.statistics();
    ensure(
        s.misses == 3 && s.pending_bytes == 0,
        format!("three chunks and nothing pending expected: {s:?}"),
    )
}

/// A `PinnedVec<u32>` goes to a `DeviceUvector` and back asynchronously, on a stream other than
/// the vector's; `wait` hands the vectors back with the data.
fn pinned_vec_round_trip_through_a_device_uvector() -> Result<(), Failed> {
    let pool = PinnedHostPool::new();
    let stream = CudaStream::non_blocking()?;
    let n = 3 * MIB / 4 + 17;
    let mut src: PinnedVec<u32> = pool.vec();
    src.extend((0..n as u32).map(|i| i.wrapping_mul(2_654_435_761)));
    let mut device = DeviceUvector::<u32>::new(n, CudaStreamView::default())?;
    let src = device.copy_from_pinned_async(src, stream.view())?.wait()?;
    let back = device.to_pinned_async(&pool, stream.view())?.wait()?;
    ensure(
        back.len() == n,
        format!("{} elements came back", back.len()),
    )?;
    ensure(back[..] == src[..], "the round trip changed the data")?;
    let mut half: PinnedVec<u32> = pool.vec();
    half.resize(n / 2, 0);
    let half = device.copy_to_pinned_async(half, stream.view())?.wait()?;
    ensure(
        half[..] == src[..n / 2],
        "a shorter destination got other data",
    )?;
    // Too long a source is a typed error, before any copy.
    let mut long: PinnedVec<u32> = pool.vec();
    long.resize(n + 1, 0);
    let e = device
        .copy_from_pinned_async(long, stream.view())
        .unwrap_err();
    ensure(
        matches!(e, MrError::OutOfRange(_)),
        format!("a too-long source: {e:?}"),
    )
}

/// The allocator: boxes and vectors of several alignments, zero-size requests, alignment
/// above 4 KiB refused; the counters follow.
fn the_allocator_honours_layouts() -> Result<(), Failed> {
    use allocator_api2::alloc::Allocator;
    let pool = PinnedHostPool::new();
    let a = pool.allocator();
    let b = allocator_api2::boxed::Box::new_in([3u64; 1000], a.clone());
    ensure(b.iter().all(|&x| x == 3), "the box's contents")?;
    for align in [1usize, 8, 256, 1024, 4096] {
        let layout = std::alloc::Layout::from_size_align(100, align).unwrap();
        let p = a.allocate(layout).map_err(|_| "allocation failed")?;
        ensure(
            p.cast::<u8>().as_ptr() as usize % align == 0,
            format!("misaligned for {align}"),
        )?;
        // SAFETY: allocated just above with this layout.
        unsafe { a.deallocate(p.cast(), layout) };
    }
    let zero = std::alloc::Layout::from_size_align(0, 64).unwrap();
    let p = a.allocate(zero).map_err(|_| "zero-size failed")?;
    // SAFETY: as above.
    unsafe { a.deallocate(p.cast(), zero) };
    let huge = std::alloc::Layout::from_size_align(64, 8192).unwrap();
    ensure(a.allocate(huge).is_err(), "an 8 KiB alignment was accepted")?;
    drop(b);
    let s = pool.statistics();
    ensure(
        s.in_use_bytes == 0 && s.peak_in_use_bytes >= 8192,
        format!("counters after the frees: {s:?}"),
    )
}

/// A pool limited to 4 MiB: a 4 MiB block, then `OutOfMemory` for another (typed, distinct
/// from other failures); after the free and `release` the chunk is given back.
fn the_limit_is_out_of_memory_and_release_gives_back() -> Result<(), Failed> {
    let pool = PinnedHostPool::with_options(PinnedPoolOptions::new().max_reserved_bytes(4 * MIB));
    let stream = CudaStreamView::default();
    let p = pool.allocate(stream, 4 * MIB, 256)?;
    let e = pool.allocate(stream, 4 * MIB, 256).unwrap_err();
    ensure(e.is_out_of_memory(), format!("over the limit: {e:?}"))?;
    let mut v: PinnedVec<u8> = pool.vec();
    ensure(v.try_reserve(MIB).is_err(), "a vector grew past the limit")?;
    // SAFETY: allocated above from this pool; nothing uses it.
    unsafe { pool.deallocate(stream, p, 4 * MIB, 256) }?;
    stream.synchronize()?;
    let released = pool.release()?;
    ensure(released == 4 * MIB, format!("released {released} bytes"))?;
    ensure(
        pool.statistics().reserved_bytes == 0,
        "bytes still reserved after release",
    )?;
    v.reserve(MIB);
    ensure(
        v.capacity() >= MIB,
        "the pool did not recover after release",
    )
}

/// As a resource: `deallocate(stream)` records an event, so the block is not reused until the
/// stream's work before the free has completed.
fn resource_frees_are_stream_ordered() -> Result<(), Failed> {
    let pool = PinnedHostPool::new();
    let s = CudaStream::non_blocking()?;
    let p = pool.allocate(s.view(), 2 * MIB, 256)?;
    stall(s.view(), Duration::from_millis(400))?;
    // SAFETY: allocated above; the stream's (stalled) work is all that follows.
    unsafe { pool.deallocate(s.view(), p, 2 * MIB, 256) }?;
    let q = pool.allocate(CudaStreamView::default(), 2 * MIB, 256)?;
    ensure(
        q != p,
        "a block freed on a stalled stream was reused at once",
    )?;
    s.synchronize()?;
    let r = pool.allocate(CudaStreamView::default(), 2 * MIB, 256)?;
    ensure(
        r == p,
        "the block did not come back after its stream finished",
    )?;
    // SAFETY: both allocated above, unused.
    unsafe {
        pool.deallocate(CudaStreamView::default(), q, 2 * MIB, 256)?;
        pool.deallocate(CudaStreamView::default(), r, 2 * MIB, 256)?;
    }
    ensure(
        pool.properties().host_accessible,
        "pinned memory is host accessible",
    )
}

/// The driver's host-located pool, where it has one: allocate on a stream, write from the host,
/// copy through the device and back, free. Where the driver lacks host pools: `Unsupported`.
fn host_located_driver_pool() -> Outcome {
    let mr = match CudaAsyncHostMemoryResource::new() {
        Ok(mr) => mr,
        Err(MrError::Unsupported(why)) => return ignored(format!("no host pools here: {why}")),
        Err(e) => return Err(format!("construction: {e:?}").into()),
    };
    let stream = CudaStream::non_blocking()?;
    let n = MIB;
    let p = mr.allocate(stream.view(), n, 256)?;
    stream.synchronize()?;
    let host: *mut u8 = p.as_host_ptr();
    // SAFETY: the allocation completed (stream synchronized); `n` bytes of host-accessible
    // memory owned by this test until it is freed below.
    let bytes = unsafe { std::slice::from_raw_parts_mut(host, n) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let mut device = DeviceUvector::<u8>::new(n, CudaStreamView::default())?;
    device.copy_from_host(bytes, stream.view())?;
    bytes.fill(0);
    device.copy_to_host(bytes, stream.view())?;
    let ok = bytes.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8);
    // SAFETY: allocated above on `stream`; the copies were waited for.
    unsafe { mr.deallocate(stream.view(), p, n, 256) }?;
    stream.synchronize()?;
    ensure(ok, "the host pool's bytes did not survive the round trip")?;
    ensure(
        mr.properties().host_accessible && mr.properties().device_accessible,
        "host pool properties",
    )?;
    done()
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu(
            "pinned::a_block_is_not_reused_before_its_streams_finish",
            a_block_is_not_reused_before_its_streams_finish,
        ),
        gpu(
            "pinned::pinned_vec_round_trip_through_a_device_uvector",
            pinned_vec_round_trip_through_a_device_uvector,
        ),
        gpu(
            "pinned::the_allocator_honours_layouts",
            the_allocator_honours_layouts,
        ),
        gpu(
            "pinned::the_limit_is_out_of_memory_and_release_gives_back",
            the_limit_is_out_of_memory_and_release_gives_back,
        ),
        gpu(
            "pinned::resource_frees_are_stream_ordered",
            resource_frees_are_stream_ordered,
        ),
        gpu_outcome("pinned::host_located_driver_pool", host_located_driver_pool),
    ];
    libtest_mimic::run(&args, trials).exit();
}
