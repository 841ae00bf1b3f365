//! GPU tests of the pool, fixed-size, binning and VMM pool resources: RMM's pool cases over the
//! CUDA and the driver-pool upstreams, and memory-contents tests of cross-stream reuse (a block freed on
//! a stalled stream and taken by another must not be written by the second before the first's
//! pending work is done) and of cross-thread frees on the per-thread default stream
//! (`cross_thread_free/...`, see `cross_thread/mod.rs`), and of retired lists and lock-free
//! waits (`.../retire/...`, see `retire/mod.rs`). Without a GPU every trial reports itself
//! ignored, with the reason.
//! Runs in both `RMM_DEFAULT_STREAM` modes in the GPU bundle; trials run one at a time (some
//! take most of the device memory).

mod cross_thread;
mod retire;

use std::sync::mpsc;
use std::time::Duration;

use cross_thread::gpu_pt;
use libtest_mimic::{Arguments, Failed};
use rmm_mr::testing::Rng;
use rmm_mr::{
    shared, BinningMemoryResource, BinningOptions, CudaAsyncMemoryResource, CudaMemoryResource,
    DeviceMemoryResource, FixedSizeMemoryResource, FixedSizeOptions, LimitingResourceAdaptor,
    MrError, PoolMemoryResource, PoolOptions, SharedResource, VmmPoolMemoryResource,
};
use rmm_stream::{stall, CudaEvent, CudaStream, CudaStreamView};
use rmm_sys::testing::{ensure, gpu, gpu_if, no_vmm};
use rmm_sys::{memory, DevicePtr};

/// The upstreams every pool case runs over.
#[derive(Debug, Clone, Copy)]
enum Upstream {
    Cuda,
    Async,
}

impl Upstream {
    fn name(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Async => "cuda_async",
        }
    }

    /// A fresh upstream (a new driver pool for the async one, so trials do not share memory).
    fn make(self) -> Result<SharedResource, Failed> {
        Ok(match self {
            Self::Cuda => shared(CudaMemoryResource::new()),
            Self::Async => shared(CudaAsyncMemoryResource::new()?),
        })
    }
}

const STALL: Duration = Duration::from_millis(200);
const WORDS: usize = 1 << 20;
const BYTES: usize = WORDS * 4;
const PATTERN_A: u32 = 0xaaaa_aaaa;
const PATTERN_B: u32 = 0x5555_5555;

fn memset(ptr: DevicePtr, value: u32, words: usize, s: CudaStreamView<'_>) -> Result<(), Failed> {
    // SAFETY: the callers pass a live allocation of at least `4 * words` bytes usable on `s`.
    unsafe { memory::memset_d32_async(ptr, value, words, s.as_raw())? };
    Ok(())
}

/// Copies `words` words back on `s` (synchronizing it) and checks they all equal `value`.
fn expect_words(
    ptr: DevicePtr,
    value: u32,
    words: usize,
    s: CudaStreamView<'_>,
) -> Result<(), Failed> {
    let mut host = vec![0u8; words * 4];
    // SAFETY: the callers pass a live allocation of at least `4 * words` bytes readable on `s`.
    unsafe { memory::copy_to_host_sync(&mut host, ptr, s.as_raw())? };
    let bad = host.chunks_exact(4).position(|w| w != value.to_ne_bytes());
    match bad {
        None => Ok(()),
        Some(i) => Err(format!(
            "word {i} of {ptr} is {:#x}, expected {value:#x}",
            u32::from_ne_bytes(host[i * 4..i * 4 + 4].try_into().unwrap_or_default())
        )
        .into()),
    }
}

/// First half of a cross-stream check: allocates `BYTES` on `a`, stalls `a`, queues a write of
/// pattern A behind the stall and frees the block on `a`. Returns the block and an event that
/// completes when `a`'s write is done (so the check can wait for it even if `a` is destroyed).
fn free_behind_a_stall(
    r: &dyn DeviceMemoryResource,
    a: CudaStreamView<'_>,
) -> Result<(DevicePtr, CudaEvent), Failed> {
    let p = r.allocate(a, BYTES, 256)?;
    stall(a, STALL)?;
    memset(p, PATTERN_A, WORDS, a)?;
    let done = CudaEvent::new()?;
    done.record(a)?;
    // SAFETY: `p` came from `r` on `a` with `BYTES`; the only work using it is ordered on `a`.
    unsafe { r.deallocate(a, p, BYTES, 256)? };
    Ok((p, done))
}

/// Second half: takes `BYTES` on `b`, which must be the same block (stolen), writes pattern B on
/// `b`, waits for both streams' work, and checks that B's bytes won.
fn take_on_b_and_check(
    r: &dyn DeviceMemoryResource,
    p: DevicePtr,
    a_done: &CudaEvent,
    b: CudaStreamView<'_>,
) -> Result<(), Failed> {
    let q = r.allocate(b, BYTES, 256)?;
    if q != p {
        // SAFETY: `q` came from `r` on `b` and was not used.
        unsafe { r.deallocate(b, q, BYTES, 256)? };
        return Err(format!("expected the freed block {p} to be stolen, got {q}").into());
    }
    check_b_wins(r, q, a_done, b)
}

/// Writes pattern B on `b` into `q` (the block stream A freed behind a stall), waits for both
/// streams' work, checks that B's bytes won and frees `q`.
fn check_b_wins(
    r: &dyn DeviceMemoryResource,
    q: DevicePtr,
    a_done: &CudaEvent,
    b: CudaStreamView<'_>,
) -> Result<(), Failed> {
    memset(q, PATTERN_B, WORDS, b)?;
    b.synchronize()?;
    a_done.synchronize()?;
    let checked = expect_words(q, PATTERN_B, WORDS, b).map_err(|e| {
        Failed::from(format!(
            "stream B wrote before stream A's pending write was done: {}",
            e.message().unwrap_or_default()
        ))
    });
    // SAFETY: `q` came from `r` on `b`; `b` was synchronized.
    unsafe { r.deallocate(b, q, BYTES, 256)? };
    checked
}

/// Takes `BYTES` on `b` once: the block A freed on a foreign stream is covered by no event
/// yet, so B must not get it (its owner is asked to record instead). Returns B's block.
fn first_try_is_not_p(
    r: &dyn DeviceMemoryResource,
    p: DevicePtr,
    b: CudaStreamView<'_>,
) -> Result<DevicePtr, Failed> {
    let q = r.allocate(b, BYTES, 256)?;
    if q == p {
        b.synchronize()?;
        // SAFETY: `q` came from `r` on `b`; `b` was synchronized.
        unsafe { r.deallocate(b, q, BYTES, 256)? };
        return Err(format!(
            "stream B got {p}, freed on foreign stream A with no event recorded after the free"
        )
        .into());
    }
    Ok(q)
}

/// A stream rmm-stream did not make (as cudarc's or another library's): created and destroyed
/// with the raw driver calls, used through a view of its handle, so a thief cannot pin it.
struct ForeignStream(rmm_sys::raw::CUstream);

impl ForeignStream {
    fn non_blocking() -> Result<Self, Failed> {
        Ok(Self(rmm_sys::stream::stream_create(
            rmm_sys::stream::CU_STREAM_NON_BLOCKING,
        )?))
    }

    fn view(&self) -> CudaStreamView<'_> {
        // SAFETY: the stream lives until `self` is dropped, and the view borrows `self`.
        unsafe { CudaStreamView::from_raw(self.0) }
    }
}

impl Drop for ForeignStream {
    fn drop(&mut self) {
        // SAFETY: created by `stream_create`, destroyed once, no view outlives `self`.
        let _ = unsafe { rmm_sys::stream::stream_destroy(self.0) };
    }
}

/// Uses `r` once on the legacy stream, so the resource has seen a stream key already (stream A
/// is then the second: its frees follow the lazy event rule from the start). The block goes
/// back to the legacy list, from which A takes it (events recorded at steal time).
fn warm_up(r: &dyn DeviceMemoryResource, bytes: usize) -> Result<(), Failed> {
    let legacy = CudaStreamView::legacy();
    let x = r.allocate(legacy, bytes, 256)?;
    // SAFETY: `x` came from `r` on the legacy stream.
    unsafe { r.deallocate(legacy, x, bytes, 256)? };
    legacy.synchronize()?;
    Ok(())
}

/// Which variant of the cross-stream check to run.
#[derive(Debug, Clone, Copy)]
enum Steal {
    /// The resource already knew a stream when A (an rmm-stream `CudaStream`) frees: B's first
    /// try pins A, records A's event on it itself, waits on it and takes A's block.
    Eager,
    /// A is the only stream the resource has seen when B appears; then as `Eager`.
    FirstToSecondStream,
    /// As `Eager` with A a foreign stream (no pin): B's first try must not get A's block; A's
    /// next allocation answers B's request by recording its event; B then steals the block
    /// and waits on the event.
    ForeignEager,
    /// As `FirstToSecondStream` with A a foreign stream; then as `ForeignEager`.
    ForeignFirstToSecondStream,
    /// Like `Eager`, and stream A is destroyed before B asks: its list is retired into the
    /// orphan list, from which B takes the block after a device synchronization.
    DestroyedStream,
    /// Like `FirstToSecondStream`, and stream A is destroyed before B asks.
    DestroyedSoleStream,
    /// The resource cannot grow (a limiting upstream): B's first try synchronizes the device
    /// and takes A's block instead of failing.
    Exhausted,
    /// A is the legacy default stream (events recorded at steal time).
    Legacy,
    /// A is another thread's per-thread default stream (events recorded at steal time).
    OtherThreadsPerThread,
}

fn steal_check(r: &dyn DeviceMemoryResource, variant: Steal) -> Result<(), Failed> {
    let b = CudaStream::non_blocking()?;
    let b = b.view();
    match variant {
        Steal::Eager | Steal::FirstToSecondStream => {
            if matches!(variant, Steal::Eager) {
                warm_up(r, 256)?;
            }
            let a = CudaStream::non_blocking()?;
            let (p, done) = free_behind_a_stall(r, a.view())?;
            take_on_b_and_check(r, p, &done, b)
        }
        Steal::ForeignEager | Steal::ForeignFirstToSecondStream => {
            if matches!(variant, Steal::ForeignEager) {
                warm_up(r, 256)?;
            }
            let a = ForeignStream::non_blocking()?;
            let (p, done) = free_behind_a_stall(r, a.view())?;
            let q1 = first_try_is_not_p(r, p, b)?;
            // A's owner answers at its next operation: it takes the block back (the best fit
            // in its own list), which records its event, and frees it again (recording, as
            // a thief asked for this stream's blocks). A's write behind the stall is pending.
            let again = r.allocate(a.view(), BYTES, 256)?;
            // SAFETY: `again` came from `r` on `a`; no work was queued with it.
            unsafe { r.deallocate(a.view(), again, BYTES, 256)? };
            let result = if again == p {
                take_on_b_and_check(r, p, &done, b)
            } else {
                Err(format!("A's own block {p} was not reused by A (got {again})").into())
            };
            // SAFETY: `q1` came from `r` on `b`; nothing used it.
            unsafe { r.deallocate(b, q1, BYTES, 256)? };
            result
        }
        Steal::DestroyedStream | Steal::DestroyedSoleStream => {
            if matches!(variant, Steal::DestroyedStream) {
                warm_up(r, 256)?;
            }
            let a = CudaStream::non_blocking()?;
            let (p, done) = free_behind_a_stall(r, a.view())?;
            drop(a);
            // B's first use retires A's list (its stream is gone): no event covers its block,
            // so B synchronizes the device, with no lock held, and takes it at once.
            take_on_b_and_check(r, p, &done, b)
        }
        Steal::Exhausted => {
            warm_up(r, 256)?;
            let a = CudaStream::non_blocking()?;
            let (p, done) = free_behind_a_stall(r, a.view())?;
            take_on_b_and_check(r, p, &done, b)
        }
        Steal::Legacy => {
            let (p, done) = free_behind_a_stall(r, CudaStreamView::legacy())?;
            take_on_b_and_check(r, p, &done, b)
        }
        Steal::OtherThreadsPerThread => {
            let (tx, rx) = mpsc::channel();
            let (finish_tx, finish_rx) = mpsc::channel::<()>();
            std::thread::scope(|sc| {
                let owner = sc.spawn(move || -> Result<(), String> {
                    let r1 = free_behind_a_stall(r, CudaStreamView::per_thread())
                        .map_err(|e| e.message().unwrap_or_default().to_owned());
                    let ok = r1.is_ok();
                    let _ = tx.send(r1);
                    // Keep this thread (and its per-thread stream) alive until B is done.
                    let _ = finish_rx.recv();
                    if ok {
                        Ok(())
                    } else {
                        Err("owner thread failed".into())
                    }
                });
                let result = match rx.recv() {
                    Ok(Ok((p, done))) => take_on_b_and_check(r, p, &done, b),
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(e.to_string().into()),
                };
                let _ = finish_tx.send(());
                let joined = owner
                    .join()
                    .map_err(|_| Failed::from("owner thread panicked"))?;
                result?;
                joined.map_err(Failed::from)
            })
        }
    }
}

/// 16 threads, each with its own stream, allocate, write, check and free at random; half of
/// the frees happen right after an asynchronous write (pending work at free time), so thieves
/// must wait for it.
fn sixteen_threads(r: &dyn DeviceMemoryResource, max_bytes: usize) -> Result<(), Failed> {
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..16u32)
            .map(|t| {
                sc.spawn(move || -> Result<(), String> {
                    let s = CudaStream::non_blocking().map_err(|e| e.to_string())?;
                    let v = s.view();
                    let mut rng = Rng::new(0x2545_f491_4f6c_dd1du64 ^ (u64::from(t) << 32 | 1));
                    let mut next = move || rng.next_u64();
                    let mut live: Vec<(DevicePtr, usize, u32)> = Vec::new();
                    let err = |e: Failed| e.message().unwrap_or_default().to_owned();
                    for i in 0..200u32 {
                        if live.len() < 8 && (live.is_empty() || next() % 2 == 0) {
                            let words = 1 + (next() as usize) % (max_bytes / 4);
                            let p = r.allocate(v, words * 4, 256).map_err(|e| e.to_string())?;
                            let pattern = (t << 24) | i | 0x0080_0000;
                            memset(p, pattern, words, v).map_err(err)?;
                            live.push((p, words, pattern));
                        } else {
                            let (p, words, pattern) =
                                live.swap_remove((next() as usize) % live.len());
                            if next() % 2 == 0 {
                                expect_words(p, pattern, words, v).map_err(|e| {
                                    format!("thread {t}: {}", e.message().unwrap_or_default())
                                })?;
                            } else {
                                // Pending work at free time: a thief must wait for it.
                                memset(p, !pattern, words, v).map_err(err)?;
                            }
                            // SAFETY: from `r` on `v` with `4 * words` bytes, freed once.
                            unsafe { r.deallocate(v, p, words * 4, 256) }
                                .map_err(|e| e.to_string())?;
                        }
                    }
                    for (p, words, pattern) in live {
                        expect_words(p, pattern, words, v).map_err(err)?;
                        // SAFETY: as above.
                        unsafe { r.deallocate(v, p, words * 4, 256) }.map_err(|e| e.to_string())?;
                    }
                    s.synchronize().map_err(|e| e.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    for r in results {
        r.map_err(Failed::from)?;
    }
    Ok(())
}

fn is_invalid_argument<T>(r: Result<T, MrError>) -> bool {
    matches!(r, Err(MrError::InvalidArgument(_)))
}

// ----- RMM's pool cases -----

fn throw_max_less_than_initial(up: Upstream) -> Result<(), Failed> {
    ensure(
        is_invalid_argument(PoolMemoryResource::with_options(
            up.make()?,
            PoolOptions::new(1024).maximum_pool_size(256),
        )),
        "initial > maximum accepted",
    )
}

fn allocate_ninety_percent(up: Upstream) -> Result<(), Failed> {
    let initial = rmm_sys::percent_of_free_device_memory(90)?;
    let pool = PoolMemoryResource::new(up.make()?, initial)?;
    ensure(
        pool.pool_size() == initial,
        "pool size is not the initial size",
    )?;
    let p = pool.allocate_sync(1 << 20, 256)?;
    // SAFETY: `p` came from `pool` with these arguments.
    unsafe { pool.deallocate_sync(p, 1 << 20, 256)? };
    Ok(())
}

fn two_large_buffers(up: Upstream) -> Result<(), Failed> {
    let (free, _) = rmm_sys::available_device_memory()?;
    let pool = PoolMemoryResource::new(up.make()?, rmm_sys::percent_of_free_device_memory(50)?)?;
    let s = CudaStreamView::default();
    let a = pool.allocate(s, free / 4, 256)?;
    let b = pool.allocate(s, free / 4, 256)?;
    ensure(a != b, "two buffers at one address")?;
    // SAFETY: both came from `pool` with these sizes.
    unsafe {
        pool.deallocate(s, a, free / 4, 256)?;
        pool.deallocate(s, b, free / 4, 256)?;
    }
    s.synchronize()?;
    Ok(())
}

fn force_growth(up: Upstream) -> Result<(), Failed> {
    let s = CudaStreamView::default();
    {
        let limited = LimitingResourceAdaptor::new(up.make()?, 6000);
        let pool = PoolMemoryResource::new(limited, 0)?;
        let a = pool.allocate(s, 1000, 256)?;
        let b = pool.allocate(s, 4000, 256)?;
        let c = pool.allocate(s, 500, 256)?;
        ensure(
            pool.pool_size() == 5760,
            format!("pool size {}", pool.pool_size()),
        )?;
        ensure(
            pool.allocate(s, 2000, 256)
                .is_err_and(|e| e.is_out_of_memory()),
            "2000 bytes did not fail with out-of-memory",
        )?;
        // SAFETY: all three came from `pool` with these sizes.
        unsafe {
            pool.deallocate(s, a, 1000, 256)?;
            pool.deallocate(s, b, 4000, 256)?;
            pool.deallocate(s, c, 500, 256)?;
        }
    }
    let limited = LimitingResourceAdaptor::new(up.make()?, 6000);
    let pool =
        PoolMemoryResource::with_options(limited, PoolOptions::new(0).maximum_pool_size(8192))?;
    let a = pool.allocate(s, 1000, 256)?;
    ensure(
        pool.allocate(s, 4000, 256)
            .is_err_and(|e| e.is_out_of_memory()),
        "4000 bytes did not fail with out-of-memory",
    )?;
    let b = pool.allocate(s, 500, 256)?;
    let c = pool.allocate(s, 2000, 256)?;
    ensure(
        pool.pool_size() == 4096,
        format!("pool size {}", pool.pool_size()),
    )?;
    // SAFETY: all three came from `pool` with these sizes.
    unsafe {
        pool.deallocate(s, a, 1000, 256)?;
        pool.deallocate(s, b, 500, 256)?;
        pool.deallocate(s, c, 2000, 256)?;
    }
    s.synchronize()?;
    Ok(())
}

fn deleted_stream(up: Upstream) -> Result<(), Failed> {
    let pool = PoolMemoryResource::new(up.make()?, 0)?;
    let size = 10_000;
    let first = {
        let stream = CudaStream::with_default_flags()?;
        let p = pool.allocate(stream.view(), size, 256)?;
        memset(p, 7, size / 4, stream.view())?;
        // SAFETY: `p` came from `pool` on this stream.
        unsafe { pool.deallocate(stream.view(), p, size, 256)? };
        p
    };
    let s = CudaStreamView::default();
    // The block was freed with no event (the pool had seen one stream) on a stream that is
    // gone: its list was retired to the orphan list, whose next thief synchronizes the device
    // and takes the block on its first try (docs/internals/stream-ordered.md, "Retiring lists").
    let p = pool.allocate(s, size, 256)?;
    ensure(p == first, "the destroyed stream's block was not reused")?;
    memset(p, 9, size / 4, s)?;
    expect_words(p, 9, size / 4, s)?;
    // SAFETY: `p` came from `pool` on `s`.
    unsafe { pool.deallocate(s, p, size, 256)? };
    Ok(())
}

fn initial_and_max_pool_size_equal(up: Upstream) -> Result<(), Failed> {
    let size = 1 << 20;
    let pool = PoolMemoryResource::with_options(
        up.make()?,
        PoolOptions::new(size).maximum_pool_size(size),
    )?;
    let p = pool.allocate_sync(1000, 256)?;
    ensure(pool.pool_size() == size, "the pool grew past its maximum")?;
    // SAFETY: `p` came from `pool`.
    unsafe { pool.deallocate_sync(p, 1000, 256)? };
    Ok(())
}

fn non_aligned_pool_size(up: Upstream) -> Result<(), Failed> {
    ensure(
        is_invalid_argument(PoolMemoryResource::new(up.make()?, 1000)),
        "an unaligned initial size was accepted",
    )?;
    ensure(
        is_invalid_argument(PoolMemoryResource::with_options(
            up.make()?,
            PoolOptions::new(1024).maximum_pool_size(1000),
        )),
        "an unaligned maximum size was accepted",
    )
}

fn pool_size(up: Upstream) -> Result<(), Failed> {
    let pool = PoolMemoryResource::new(up.make()?, 1 << 20)?;
    ensure(pool.pool_size() >= 1 << 20, "pool_size() < initial size")?;
    let p = pool.allocate_sync(2 << 20, 256)?;
    ensure(pool.pool_size() >= 3 << 20, "growth not counted")?;
    // SAFETY: `p` came from `pool`.
    unsafe { pool.deallocate_sync(p, 2 << 20, 256)? };
    ensure(pool.release_unused()? > 0, "nothing released")?;
    Ok(())
}

// ----- memory contents -----

/// The upstream of a steal check: for [`Steal::Exhausted`], capped so that the resource cannot
/// grow after stream A's block and the warm-up block.
fn steal_upstream(up: Upstream, variant: Steal) -> Result<SharedResource, Failed> {
    let upstream = up.make()?;
    Ok(match variant {
        Steal::Exhausted => shared(LimitingResourceAdaptor::new(upstream, BYTES + 256)),
        _ => upstream,
    })
}

fn pool_steal(up: Upstream, variant: Steal) -> Result<(), Failed> {
    let pool = PoolMemoryResource::new(steal_upstream(up, variant)?, 0)?;
    steal_check(&pool, variant)?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")
}

fn fixed_size_steal(up: Upstream, variant: Steal) -> Result<(), Failed> {
    // One block per chunk, so the only free block is the one freed on stream A.
    let fixed = FixedSizeMemoryResource::with_options(
        steal_upstream(up, variant)?,
        FixedSizeOptions::new()
            .block_size(BYTES)
            .blocks_to_preallocate(1),
    )?;
    steal_check(&fixed, variant)?;
    ensure(fixed.outstanding_allocations() == 0, "allocations left")
}

fn pool_sixteen_threads(up: Upstream) -> Result<(), Failed> {
    let pool = PoolMemoryResource::new(up.make()?, 0)?;
    sixteen_threads(&pool, 1 << 20)?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")?;
    pool.release_unused()?;
    Ok(())
}

fn fixed_size_sixteen_threads(up: Upstream) -> Result<(), Failed> {
    let fixed = FixedSizeMemoryResource::with_options(
        up.make()?,
        FixedSizeOptions::new()
            .block_size(1 << 20)
            .blocks_to_preallocate(16),
    )?;
    sixteen_threads(&fixed, 1 << 20)?;
    ensure(fixed.outstanding_allocations() == 0, "allocations left")
}

fn binning_contents(up: Upstream) -> Result<(), Failed> {
    let binning = BinningMemoryResource::with_options(
        up.make()?,
        BinningOptions::new()
            .min_size_exponent(18)
            .max_size_exponent(22),
    )?;
    ensure(binning.bin_sizes().len() == 5, "bins")?;
    let s = CudaStream::non_blocking()?;
    let v = s.view();
    let sizes = [0usize, 4, 1 << 18, (1 << 18) + 4, 3 << 20, 8 << 20];
    let mut live = Vec::new();
    for (i, &bytes) in sizes.iter().enumerate() {
        let p = binning.allocate(v, bytes, 256)?;
        ensure(
            (bytes == 0) == p.is_null(),
            format!("{bytes} bytes gave {p}"),
        )?;
        if bytes > 0 {
            memset(p, i as u32 + 1, bytes / 4, v)?;
        }
        live.push((p, bytes, i as u32 + 1));
    }
    for (p, bytes, value) in live {
        if bytes > 0 {
            expect_words(p, value, bytes / 4, v)?;
        }
        // SAFETY: from `binning` on `v` with `bytes`.
        unsafe { binning.deallocate(v, p, bytes, 256)? };
    }
    sixteen_threads(&binning, 1 << 20)
}

/// A bin added late, served by the CUDA resource, over sizes a fixed-size bin already handed
/// out: the old block's free must reach the fixed-size bin (a `cuMemFree` of a chunk's base
/// would release the bin's memory under its other live block, any other address fails), and
/// new requests go to the new bin.
fn binning_late_bin(up: Upstream) -> Result<(), Failed> {
    const KIB: usize = 1 << 10;
    let binning = BinningMemoryResource::with_options(
        up.make()?,
        BinningOptions::new()
            .min_size_exponent(18)
            .max_size_exponent(20),
    )?;
    let s = CudaStream::non_blocking()?;
    let v = s.view();
    // Both from the 1 MiB bin: the first is often its chunk's base.
    let old = binning.allocate(v, 600 * KIB, 256)?;
    let neighbour = binning.allocate(v, 900 * KIB, 256)?;
    memset(old, 1, 600 * KIB / 4, v)?;
    memset(neighbour, 2, 900 * KIB / 4, v)?;
    binning.add_bin(768 * KIB, Some(shared(CudaMemoryResource::new())))?;
    // SAFETY: from `binning` on `v` with 600 KiB, freed once.
    unsafe { binning.deallocate(v, old, 600 * KIB, 256)? };
    let new = binning.allocate(v, 600 * KIB, 256)?;
    memset(new, 3, 600 * KIB / 4, v)?;
    expect_words(neighbour, 2, 900 * KIB / 4, v)?;
    expect_words(new, 3, 600 * KIB / 4, v)?;
    // SAFETY: each from `binning` on `v` with these sizes, freed once.
    unsafe {
        binning.deallocate(v, new, 600 * KIB, 256)?;
        binning.deallocate(v, neighbour, 900 * KIB, 256)?;
    }
    Ok(())
}

// ----- the VMM pool (no upstream: it maps its own memory) -----

/// A VMM pool whose chunks are `BYTES` when a `BYTES` request finds nothing free, as the
/// pool's first chunk is (2 MiB granules), and that cannot grow past `maximum`.
fn vmm_pool(maximum: usize) -> Result<VmmPoolMemoryResource, Failed> {
    let pool = VmmPoolMemoryResource::new(maximum)?;
    ensure(
        BYTES % pool.granularity() == 0,
        format!("granularity {} does not divide {BYTES}", pool.granularity()),
    )?;
    Ok(pool)
}

fn vmm_steal(variant: Steal) -> Result<(), Failed> {
    // "Cannot grow": room for the warm-up's granule and one block, not a second block.
    let maximum = match variant {
        Steal::Exhausted => BYTES + (2 << 20),
        _ => 1 << 30,
    };
    let pool = vmm_pool(maximum)?;
    steal_check(&pool, variant)?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")
}

fn vmm_sixteen_threads() -> Result<(), Failed> {
    let pool = vmm_pool(8 << 30)?;
    sixteen_threads(&pool, 1 << 20)?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")?;
    let before = pool.pool_size();
    let released = pool.release_unused()?;
    ensure(
        pool.pool_size() == before - released,
        format!(
            "{before} bytes mapped, {released} released, {} left",
            pool.pool_size()
        ),
    )
}

fn vmm_cross_thread_free(
    stream: cross_thread::PtStream,
    pending: cross_thread::Pending,
) -> Result<(), Failed> {
    let pool = vmm_pool(1 << 30)?;
    cross_thread::run(
        &pool,
        BYTES,
        stream,
        pending,
        cross_thread::Reuse::Same,
        &|_| Ok(Vec::new()),
    )?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")
}

// ----- cross-thread frees on the per-thread default stream -----

/// The resources of the cross-thread trials. Each holds exactly one free block of `BYTES`
/// after thread 2's free, so thread 2's allocation must be that block: it reaches thread 2
/// through the legacy stream's list, behind an event that waits for thread 1's work.
#[derive(Debug, Clone, Copy)]
enum CrossThreadSubject {
    Pool,
    FixedSize,
    /// A binning resource whose bin for `BYTES` is a fixed-size resource.
    BinningFixed,
    /// A binning resource whose bin for `BYTES` is a pool.
    BinningPool,
}

impl CrossThreadSubject {
    const ALL: [Self; 4] = [
        Self::Pool,
        Self::FixedSize,
        Self::BinningFixed,
        Self::BinningPool,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::FixedSize => "fixed_size",
            Self::BinningFixed => "binning_fixed_size_bin",
            Self::BinningPool => "binning_pool_bin",
        }
    }
}

/// Thread 1 allocates on its per-thread stream and queues work behind a stall, thread 2 frees
/// the block on its own and reallocates it (see `cross_thread/mod.rs`).
fn cross_thread_free(
    up: Upstream,
    subject: CrossThreadSubject,
    stream: cross_thread::PtStream,
    pending: cross_thread::Pending,
) -> Result<(), Failed> {
    let run = |r: &dyn DeviceMemoryResource| {
        cross_thread::run(
            r,
            BYTES,
            stream,
            pending,
            cross_thread::Reuse::Same,
            &|_| Ok(Vec::new()),
        )
    };
    // One block per chunk, so the only free block is the one thread 2 freed.
    let fixed = |upstream| {
        FixedSizeMemoryResource::with_options(
            upstream,
            FixedSizeOptions::new()
                .block_size(BYTES)
                .blocks_to_preallocate(1),
        )
    };
    match subject {
        CrossThreadSubject::Pool => {
            let pool = PoolMemoryResource::new(up.make()?, 0)?;
            run(&pool)?;
            ensure(pool.outstanding_allocations() == 0, "allocations left")
        }
        CrossThreadSubject::FixedSize => {
            let fixed = fixed(up.make()?)?;
            run(&fixed)?;
            ensure(fixed.outstanding_allocations() == 0, "allocations left")
        }
        CrossThreadSubject::BinningFixed | CrossThreadSubject::BinningPool => {
            let bin = match subject {
                CrossThreadSubject::BinningFixed => shared(fixed(up.make()?)?),
                _ => shared(PoolMemoryResource::new(up.make()?, 0)?),
            };
            let binning = BinningMemoryResource::new(up.make()?);
            binning.add_bin(BYTES, Some(bin))?;
            run(&binning)
        }
    }
}

/// One of RMM's pool cases, run over an upstream.
type Case = fn(Upstream) -> Result<(), Failed>;

fn main() {
    let mut args = Arguments::from_args();
    // Several trials take most of the device memory: one at a time.
    args.test_threads.get_or_insert(1);
    let pool_cases: [(&str, Case); 8] = [
        ("throw_max_less_than_initial", throw_max_less_than_initial),
        ("allocate_ninety_percent", allocate_ninety_percent),
        ("two_large_buffers", two_large_buffers),
        ("force_growth", force_growth),
        ("deleted_stream", deleted_stream),
        (
            "initial_and_max_pool_size_equal",
            initial_and_max_pool_size_equal,
        ),
        ("non_aligned_pool_size", non_aligned_pool_size),
        ("pool_size", pool_size),
    ];
    let steals = [
        ("eager", Steal::Eager),
        ("first_to_second_stream", Steal::FirstToSecondStream),
        ("foreign_eager", Steal::ForeignEager),
        (
            "foreign_first_to_second_stream",
            Steal::ForeignFirstToSecondStream,
        ),
        ("destroyed_stream", Steal::DestroyedStream),
        ("destroyed_sole_stream", Steal::DestroyedSoleStream),
        ("exhausted", Steal::Exhausted),
        ("legacy", Steal::Legacy),
        ("other_threads_per_thread", Steal::OtherThreadsPerThread),
    ];
    let mut trials = Vec::new();
    for up in [Upstream::Cuda, Upstream::Async] {
        let u = up.name();
        for (name, f) in pool_cases {
            trials.push(gpu(format!("pool/{u}/{name}"), move || f(up)));
        }
        for (name, variant) in steals {
            trials.push(gpu(format!("pool/{u}/steal_contents/{name}"), move || {
                pool_steal(up, variant)
            }));
            trials.push(gpu(
                format!("fixed_size/{u}/steal_contents/{name}"),
                move || fixed_size_steal(up, variant),
            ));
        }
        trials.push(gpu(format!("pool/{u}/sixteen_threads"), move || {
            pool_sixteen_threads(up)
        }));
        trials.push(gpu(format!("fixed_size/{u}/sixteen_threads"), move || {
            fixed_size_sixteen_threads(up)
        }));
        trials.push(gpu(
            format!("pool/{u}/retire/threads_and_streams"),
            move || retire::pool_threads_and_streams(up.make()?),
        ));
        trials.push(gpu(
            format!("fixed_size/{u}/retire/threads_and_streams"),
            move || retire::fixed_size_threads_and_streams(up.make()?),
        ));
        trials.push(gpu(
            format!("pool/{u}/retire/thief_holds_no_lock"),
            move || retire::thief_holds_no_lock(up.make()?),
        ));
        trials.push(gpu(format!("binning/{u}/contents"), move || {
            binning_contents(up)
        }));
        trials.push(gpu(format!("binning/{u}/late_bin"), move || {
            binning_late_bin(up)
        }));
        for subject in CrossThreadSubject::ALL {
            for stream in cross_thread::PtStream::ALL {
                for pending in cross_thread::Pending::ALL {
                    trials.push(gpu_pt(
                        format!(
                            "cross_thread_free/{}/{u}/{}/{}",
                            subject.name(),
                            stream.name(),
                            pending.name()
                        ),
                        stream,
                        move || cross_thread_free(up, subject, stream, pending),
                    ));
                }
            }
        }
    }
    for (name, variant) in steals {
        trials.push(gpu_if(
            format!("vmm_pool/steal_contents/{name}"),
            no_vmm,
            move || vmm_steal(variant),
        ));
    }
    trials.push(gpu_if(
        "vmm_pool/sixteen_threads",
        no_vmm,
        vmm_sixteen_threads,
    ));
    for stream in cross_thread::PtStream::ALL {
        for pending in cross_thread::Pending::ALL {
            trials.push(gpu_if(
                format!(
                    "cross_thread_free/vmm_pool/{}/{}",
                    stream.name(),
                    pending.name()
                ),
                move || stream.unavailable().or_else(no_vmm),
                move || vmm_cross_thread_free(stream, pending),
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
