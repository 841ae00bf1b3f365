//! Exhaustion and recovery for every device resource (`exhaustion/<resource>`): allocate until
//! the resource answers [`MrError::OutOfMemory`] (any other error, or a panic, fails the
//! trial), check that the refusal changed no bookkeeping, free everything, check that the
//! statistics are back to zero, and allocate until out-of-memory once more: the second round
//! must get as far as the first. Every block is filled on its stream and its head and tail are
//! checked before it is freed.
//!
//! What runs out: the device itself for the CUDA and driver-pool resources (blocks of an eighth
//! of the free memory, halved after each refusal down to 32 MiB, so an 80 GB device runs out in
//! about 20 allocations), a pool's maximum size, an arena's size, and a limiting adaptor under
//! the fixed-size and binning resources and over a pool. Each resource sits under a statistics
//! adaptor, whose counters must match what is held at the refusal and be zero after the frees.
//!
//! Each trial prints one line, `exhaustion: <resource>: ...`, for `docs/reliability.md`.
//! Without a GPU every trial reports itself ignored. Trials run one at a time (some take the
//! whole device).

use libtest_mimic::{Arguments, Failed, Trial};
use rmm_mr::{
    shared, ArenaMemoryResource, ArenaOptions, BinningMemoryResource, CudaAsyncMemoryResource,
    CudaMemoryResource, DeviceMemoryResource, FixedSizeMemoryResource, FixedSizeOptions,
    LimitingResourceAdaptor, MrError, PoolMemoryResource, PoolOptions, StatisticsResourceAdaptor,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::testing::{self, ensure, no_pools, one_at_a_time};
use rmm_sys::{memory, DevicePtr};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A round that never runs out within this many allocations fails.
const MAX_BLOCKS: usize = 100_000;
/// Bytes checked at each end of a block before it is freed.
const CHECKED: usize = 64 * KIB;

/// The sizes a round asks for.
#[derive(Debug, Clone, Copy)]
enum Sizes {
    /// These sizes in turn; the first refusal ends the round.
    Cycle(&'static [usize]),
    /// `start`, and after each refusal half the size (in whole MiB) while that is at least
    /// `floor`; a refusal of a size below `2 * floor` ends the round.
    Halving { start: usize, floor: usize },
}

/// A block held by a round.
#[derive(Debug)]
struct Held {
    ptr: DevicePtr,
    bytes: usize,
    pattern: u32,
    /// Index into the trial's streams.
    stream: usize,
}

/// What a round held when the resource ran out.
struct Round {
    held: Vec<Held>,
    bytes: u64,
    error: MrError,
}

fn fill(p: DevicePtr, bytes: usize, pattern: u32, s: CudaStreamView<'_>) -> Result<(), Failed> {
    ensure(
        bytes % 4 == 0,
        format!("test sizes are multiples of 4, not {bytes}"),
    )?;
    // SAFETY: `p` is a live allocation of `bytes` bytes made on `s`.
    unsafe { memory::memset_d32_async(p, pattern, bytes / 4, s.as_raw())? };
    Ok(())
}

/// Copies the first and last [`CHECKED`] bytes of `h` back on its stream and compares them
/// with its pattern; returns the bytes compared.
fn check(h: &Held, s: CudaStreamView<'_>) -> Result<u64, Failed> {
    let n = h.bytes.min(CHECKED);
    let mut host = vec![0u8; n];
    let mut compared = 0;
    for offset in [0, h.bytes - n] {
        let at = h
            .ptr
            .checked_add(offset)
            .ok_or("the checked address overflows")?;
        // SAFETY: `[at, at + n)` lies in the live block `h`, written on `s`.
        unsafe { memory::copy_to_host_sync(&mut host, at, s.as_raw())? };
        if let Some(i) = host
            .chunks_exact(4)
            .position(|w| w != h.pattern.to_ne_bytes())
        {
            return Err(format!(
                "byte {} of the {}-byte block {} holds {:02x?}, expected the pattern {:#010x}",
                offset + i * 4,
                h.bytes,
                h.ptr,
                &host[i * 4..i * 4 + 4],
                h.pattern
            )
            .into());
        }
        compared += n as u64;
    }
    Ok(compared)
}

/// Checks and frees every block on its stream (all of them, even after a failed check), then
/// synchronizes the streams; returns the bytes compared or the first error.
fn free_all(
    mr: &dyn DeviceMemoryResource,
    streams: &[CudaStreamView<'_>],
    held: Vec<Held>,
) -> Result<u64, Failed> {
    let mut verified = 0;
    let mut first: Result<(), Failed> = Ok(());
    // Last in, first out: the smallest blocks of a halving round go first.
    for h in held.into_iter().rev() {
        let s = streams[h.stream];
        match check(&h, s) {
            Ok(n) => verified += n,
            Err(e) if first.is_ok() => first = Err(e),
            Err(_) => {}
        }
        // SAFETY: `h` came from `mr` on `s` with `h.bytes` and is freed once, on its stream.
        if let Err(e) = unsafe { mr.deallocate(s, h.ptr, h.bytes, 256) } {
            if first.is_ok() {
                first = Err(format!("free of {} ({} bytes): {e}", h.ptr, h.bytes).into());
            }
        }
    }
    for s in streams {
        s.synchronize()?;
    }
    first.map(|()| verified)
}

/// Allocates until the first out-of-memory answer (for [`Sizes::Halving`], until even the
/// smallest size is refused), filling every block. Any other error frees what is held and fails.
fn allocate_until_oom(
    mr: &dyn DeviceMemoryResource,
    streams: &[CudaStreamView<'_>],
    sizes: Sizes,
    round: u32,
) -> Result<Round, Failed> {
    let mut held: Vec<Held> = Vec::new();
    let mut bytes_held = 0u64;
    let mut size = match sizes {
        Sizes::Cycle(list) => list[0],
        Sizes::Halving { start, .. } => start,
    };
    let mut i = 0usize;
    loop {
        if held.len() >= MAX_BLOCKS {
            let _ = free_all(mr, streams, held);
            return Err(format!("{MAX_BLOCKS} allocations and still no out-of-memory").into());
        }
        let stream = i % streams.len();
        let s = streams[stream];
        i += 1;
        match mr.allocate(s, size, 256) {
            Ok(ptr) => {
                let pattern = (round << 28) | (i as u32 & 0x0fff_ffff);
                let filled = fill(ptr, size, pattern, s);
                held.push(Held {
                    ptr,
                    bytes: size,
                    pattern,
                    stream,
                });
                bytes_held += size as u64;
                if let Err(e) = filled {
                    let _ = free_all(mr, streams, held);
                    return Err(e);
                }
                if let Sizes::Cycle(list) = sizes {
                    size = list[held.len() % list.len()];
                }
            }
            Err(e) if e.is_out_of_memory() => match sizes {
                Sizes::Halving { floor, .. } if size / 2 >= floor => {
                    size = (size / 2) / MIB * MIB;
                }
                _ => {
                    return Ok(Round {
                        held,
                        bytes: bytes_held,
                        error: e,
                    })
                }
            },
            Err(e) => {
                let _ = free_all(mr, streams, held);
                return Err(format!(
                    "allocation {} ({size} bytes) failed with an error other than \
                     out-of-memory: {e:?}",
                    i - 1
                )
                .into());
            }
        }
    }
}

/// How far the second round must get.
#[derive(Debug, Clone, Copy)]
enum Recovery {
    /// Exactly as many allocations as the first (a deterministic limit).
    Same,
    /// At least as many.
    AtLeast,
    /// Within 1 % (at least 512 MiB) of the first round's bytes: the device, where the driver
    /// may use some memory between the rounds.
    Near,
}

/// Two rounds and their checks.
struct Outcome {
    first: (usize, u64),
    second: (usize, u64),
    verified: u64,
    error: MrError,
}

fn statistics_are_zero<U: DeviceMemoryResource>(
    mr: &StatisticsResourceAdaptor<U>,
    when: &str,
) -> Result<(), Failed> {
    let (bytes, allocations) = mr.counters();
    ensure(
        bytes.value == 0 && allocations.value == 0,
        format!(
            "{when}: statistics count {} bytes in {} allocations",
            bytes.value, allocations.value
        ),
    )
}

fn exhaust<U: DeviceMemoryResource>(
    mr: &StatisticsResourceAdaptor<U>,
    streams: &[CudaStreamView<'_>],
    sizes: Sizes,
    recovery: Recovery,
) -> Result<Outcome, Failed> {
    let r1 = allocate_until_oom(mr, streams, sizes, 1)?;
    let first = (r1.held.len(), r1.bytes);
    let (bytes, allocations) = mr.counters();
    let verified = free_all(mr, streams, r1.held)?;
    ensure(
        bytes.value == first.1 as i64 && allocations.value == first.0 as i64,
        format!(
            "at the refusal the statistics counted {} bytes in {} allocations, {} bytes in {} \
             were held",
            bytes.value, allocations.value, first.1, first.0
        ),
    )?;
    statistics_are_zero(mr, "after freeing the first round")?;
    let r2 = allocate_until_oom(mr, streams, sizes, 2)?;
    let second = (r2.held.len(), r2.bytes);
    let verified = verified + free_all(mr, streams, r2.held)?;
    statistics_are_zero(mr, "after freeing the second round")?;
    let (_, allocations) = mr.counters();
    ensure(
        allocations.total == (first.0 + second.0) as i64,
        format!(
            "the statistics counted {} allocations in all, {} succeeded",
            allocations.total,
            first.0 + second.0
        ),
    )?;
    let recovered = match recovery {
        Recovery::Same => second.0 == first.0,
        Recovery::AtLeast => second.0 >= first.0,
        Recovery::Near => second.1 + (first.1 / 100).max(512 * MIB as u64) >= first.1,
    };
    ensure(
        recovered,
        format!(
            "after freeing everything the resource did not recover ({recovery:?}): {} \
             allocations ({} bytes) the first time, {} ({} bytes) the second",
            first.0, first.1, second.0, second.1
        ),
    )?;
    ensure(first.0 > 0, "the first allocation was refused already")?;
    Ok(Outcome {
        first,
        second,
        verified,
        error: r1.error,
    })
}

fn report(name: &str, o: &Outcome, extra: &str) {
    println!(
        "exhaustion: {name}: {} allocations ({} bytes) until out-of-memory, {} ({} bytes) again \
         after freeing everything, statistics back to zero, {} bytes verified{extra}; the \
         refusal: {}",
        o.first.0, o.first.1, o.second.0, o.second.1, o.verified, o.error
    );
}

/// A trial, one at a time (some take the whole device).
fn trial(name: &str, unmet: fn() -> Option<String>, f: fn(&str) -> Result<(), Failed>) -> Trial {
    let name = name.to_owned();
    testing::gpu_if(format!("exhaustion/{name}"), unmet, move || {
        let _serial = one_at_a_time();
        f(&name)
    })
}

fn no_need() -> Option<String> {
    None
}

/// Blocks of an eighth of the free memory (at least 64 MiB), halved down to 32 MiB.
fn device_sizes() -> Result<(Sizes, usize, usize), Failed> {
    let (free, total) = rmm_sys::available_device_memory()?;
    let start = (free / 8 / MIB * MIB).max(64 * MIB);
    Ok((
        Sizes::Halving {
            start,
            floor: 32 * MIB,
        },
        free,
        total,
    ))
}

// ----- the subjects -----

fn cuda(name: &str) -> Result<(), Failed> {
    let (sizes, free, total) = device_sizes()?;
    let mr = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    let s = CudaStream::non_blocking()?;
    let o = exhaust(&mr, &[s.view()], sizes, Recovery::Near)?;
    report(
        name,
        &o,
        &format!(", device {free} of {total} bytes free at the start"),
    );
    Ok(())
}

fn cuda_async(name: &str) -> Result<(), Failed> {
    let (sizes, free, total) = device_sizes()?;
    let mr = StatisticsResourceAdaptor::new(CudaAsyncMemoryResource::new()?);
    let s = CudaStream::non_blocking()?;
    let o = exhaust(
        &mr,
        &[s.view(), CudaStreamView::per_thread()],
        sizes,
        Recovery::Near,
    )?;
    let pool = mr.upstream();
    let st = pool.statistics()?;
    ensure(
        st.used_current == 0,
        format!("the driver pool has {} bytes in use", st.used_current),
    )?;
    pool.trim_to(0)?;
    let trimmed = pool.statistics()?;
    ensure(
        trimmed.reserved_current == 0,
        format!(
            "the driver pool kept {} bytes after trim_to(0)",
            trimmed.reserved_current
        ),
    )?;
    // The memory went back to the device: another resource gets half of it in one block.
    let half = (o.first.1 as usize / 2) / MIB * MIB;
    let cuda = CudaMemoryResource::new();
    let p = cuda
        .allocate_sync(half, 256)
        .map_err(|e| format!("after trim_to(0), {half} bytes from cuMemAlloc failed: {e}"))?;
    // SAFETY: `p` came from `cuda` with this size.
    unsafe { cuda.deallocate_sync(p, half, 256)? };
    report(
        name,
        &o,
        &format!(
            ", device {free} of {total} bytes free at the start, pool high-water mark {} \
             bytes, trimmed to 0",
            st.reserved_high
        ),
    );
    Ok(())
}

fn pool_maximum(name: &str) -> Result<(), Failed> {
    let max = 64 * MIB;
    let mr = StatisticsResourceAdaptor::new(PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(0).maximum_pool_size(max),
    )?);
    let s = CudaStream::non_blocking()?;
    let o = exhaust(&mr, &[s.view()], Sizes::Cycle(&[MIB]), Recovery::Same)?;
    let pool = mr.upstream();
    ensure(
        pool.pool_size() <= max,
        format!("the pool grew to {} bytes", pool.pool_size()),
    )?;
    let size_before = pool.pool_size();
    pool.release_unused()?;
    ensure(
        pool.pool_size() == 0,
        format!(
            "release_unused kept {} of {size_before} bytes with nothing allocated",
            pool.pool_size()
        ),
    )?;
    let p = mr.allocate(s.view(), max, 256)?;
    // SAFETY: `p` came from `mr` on `s` with this size.
    unsafe { mr.deallocate(s.view(), p, max, 256)? };
    s.synchronize()?;
    report(
        name,
        &o,
        &format!(", maximum {max} bytes, pool {size_before} bytes, released, then one block of the maximum"),
    );
    Ok(())
}

fn limiting_pool(name: &str) -> Result<(), Failed> {
    let limit = 64 * MIB;
    let pool = PoolMemoryResource::new(CudaMemoryResource::new(), 0)?;
    let limiting = LimitingResourceAdaptor::new(pool.clone(), limit);
    let mr = StatisticsResourceAdaptor::new(limiting.clone());
    let s = CudaStream::non_blocking()?;
    let sizes = Sizes::Cycle(&[MIB, 3 * MIB, 256 * KIB, 4 * KIB]);
    let o = exhaust(&mr, &[s.view()], sizes, Recovery::Same)?;
    ensure(
        limiting.allocated_bytes() == 0,
        format!(
            "the limiting adaptor counts {} bytes",
            limiting.allocated_bytes()
        ),
    )?;
    ensure(
        pool.outstanding_allocations() == 0,
        format!(
            "{} pool allocations outstanding",
            pool.outstanding_allocations()
        ),
    )?;
    report(name, &o, &format!(", limit {limit} bytes"));
    Ok(())
}

fn limiting_cuda(name: &str) -> Result<(), Failed> {
    let limit = 32 * MIB;
    let limiting = LimitingResourceAdaptor::new(CudaMemoryResource::new(), limit);
    let mr = StatisticsResourceAdaptor::new(limiting.clone());
    let s = CudaStream::non_blocking()?;
    let o = exhaust(
        &mr,
        &[s.view()],
        Sizes::Cycle(&[MIB, 3 * MIB + 256]),
        Recovery::Same,
    )?;
    ensure(
        limiting.allocated_bytes() == 0,
        format!(
            "the limiting adaptor counts {} bytes",
            limiting.allocated_bytes()
        ),
    )?;
    report(name, &o, &format!(", limit {limit} bytes"));
    Ok(())
}

fn arena(name: &str) -> Result<(), Failed> {
    let size = 64 * MIB;
    let mr = StatisticsResourceAdaptor::new(ArenaMemoryResource::with_options(
        CudaMemoryResource::new(),
        ArenaOptions::new().arena_size(size),
    )?);
    let s = CudaStream::non_blocking()?;
    let sizes = Sizes::Cycle(&[64 * KIB, 3 * MIB / 2, 300 * KIB, 4 * MIB, 8 * KIB]);
    // Two streams, so two arenas hold superblocks when it runs out.
    let o = exhaust(
        &mr,
        &[s.view(), CudaStreamView::per_thread()],
        sizes,
        Recovery::AtLeast,
    )?;
    let arena = mr.upstream();
    let whole = arena.arena_size();
    let p = arena.allocate(s.view(), whole, 256).map_err(|e| {
        format!("after freeing everything the whole arena ({whole} bytes) cannot be allocated: {e}")
    })?;
    // SAFETY: `p` came from `arena` on `s` with this size.
    unsafe { arena.deallocate(s.view(), p, whole, 256)? };
    s.synchronize()?;
    report(
        name,
        &o,
        &format!(
            ", arena {whole} bytes ({:.1} % held at the refusal), then the whole arena in one block",
            o.first.1 as f64 * 100.0 / whole as f64
        ),
    );
    Ok(())
}

fn binning(name: &str) -> Result<(), Failed> {
    let limit = 64 * MIB;
    let limiting = LimitingResourceAdaptor::new(CudaMemoryResource::new(), limit);
    let binning = BinningMemoryResource::new(limiting.clone());
    binning.add_bin(
        64 * KIB,
        Some(shared(FixedSizeMemoryResource::with_options(
            limiting.clone(),
            FixedSizeOptions::new()
                .block_size(64 * KIB)
                .blocks_to_preallocate(8),
        )?)),
    )?;
    binning.add_bin(
        MIB,
        Some(shared(FixedSizeMemoryResource::with_options(
            limiting.clone(),
            FixedSizeOptions::new()
                .block_size(MIB)
                .blocks_to_preallocate(4),
        )?)),
    )?;
    let mr = StatisticsResourceAdaptor::new(binning);
    let s = CudaStream::non_blocking()?;
    // Both bins and the upstream (5 MiB is above the largest bin).
    let sizes = Sizes::Cycle(&[4 * KIB, 64 * KIB, MIB, 5 * MIB]);
    let o = exhaust(&mr, &[s.view()], sizes, Recovery::Same)?;
    report(
        name,
        &o,
        &format!(", limit {limit} bytes under the bins and the upstream"),
    );
    Ok(())
}

fn fixed_size(name: &str) -> Result<(), Failed> {
    let limit = 16 * MIB;
    let limiting = LimitingResourceAdaptor::new(CudaMemoryResource::new(), limit);
    let mr = StatisticsResourceAdaptor::new(FixedSizeMemoryResource::with_options(
        limiting.clone(),
        FixedSizeOptions::new()
            .block_size(MIB)
            .blocks_to_preallocate(4),
    )?);
    let s = CudaStream::non_blocking()?;
    let o = exhaust(
        &mr,
        &[s.view(), CudaStreamView::per_thread()],
        Sizes::Cycle(&[MIB, 4 * KIB]),
        Recovery::Same,
    )?;
    ensure(
        o.first.0 == limit / MIB,
        format!(
            "{} blocks of 1 MiB before out-of-memory under a {limit}-byte limit, expected {}",
            o.first.0,
            limit / MIB
        ),
    )?;
    report(name, &o, &format!(", limit {limit} bytes, blocks of 1 MiB"));
    Ok(())
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let trials = vec![
        trial("cuda", no_need, cuda),
        trial("cuda_async", no_pools, cuda_async),
        trial("pool_maximum", no_need, pool_maximum),
        trial("limiting_pool", no_need, limiting_pool),
        trial("limiting_cuda", no_need, limiting_cuda),
        trial("arena", no_need, arena),
        trial("binning", no_need, binning),
        trial("fixed_size", no_need, fixed_size),
    ];
    libtest_mimic::run(&args, trials).exit();
}
