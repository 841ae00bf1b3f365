//! GPU tests of the arena resource: RMM's `arena_mr_tests.cpp` resource cases, plus
//! memory-contents tests of the stream-ordering guarantees (a block freed on one stream and
//! reused by another must not be overwritten by the first stream's late work), of cross-thread
//! frees on the per-thread default stream (`cross_thread_free/...`, see `cross_thread/mod.rs`)
//! and a 16-thread stress with content checks. Without a GPU every trial reports itself
//! ignored, with the reason.

mod cross_thread;

use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use rmm_mr::testing::Rng;
use rmm_mr::{
    ArenaMemoryResource, ArenaOptions, CudaMemoryResource, DeviceMemoryResource, MrError,
};
use rmm_stream::{stall, CudaStream, CudaStreamView};
use rmm_sys::testing::{self, ensure, one_at_a_time};
use rmm_sys::{memory, DevicePtr};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const STALL: Duration = Duration::from_millis(200);

type Arena = ArenaMemoryResource<CudaMemoryResource>;

/// A GPU trial. Trials take large shares of the device's memory (90 % of it, half of it), so
/// they run one at a time even when the harness runs trials in parallel.
fn gpu(name: &str, f: fn() -> Result<(), Failed>) -> Trial {
    testing::gpu(name, move || {
        let _serial = one_at_a_time();
        f()
    })
}

/// A cross-thread trial on `stream`, one at a time like [`gpu`]'s.
fn gpu_pt(
    name: String,
    stream: cross_thread::PtStream,
    f: impl FnOnce() -> Result<(), Failed> + Send + 'static,
) -> Trial {
    cross_thread::gpu_pt(name, stream, move || {
        let _serial = one_at_a_time();
        f()
    })
}

fn arena(size: usize) -> Result<Arena, Failed> {
    Ok(ArenaMemoryResource::with_options(
        CudaMemoryResource::new(),
        ArenaOptions::new().arena_size(size),
    )?)
}

fn free(
    mr: &Arena,
    stream: CudaStreamView<'_>,
    ptr: DevicePtr,
    bytes: usize,
) -> Result<(), Failed> {
    // SAFETY: the trials free what they allocated from `mr`, once, on a stream after which the
    // memory may be reused.
    unsafe { mr.deallocate(stream, ptr, bytes, 256)? };
    Ok(())
}

/// Writes `value` into every 32-bit word of `[ptr, ptr + bytes)` on `stream`.
fn set(ptr: DevicePtr, bytes: usize, value: u32, stream: CudaStreamView<'_>) -> Result<(), Failed> {
    // SAFETY: `ptr` is a live allocation of at least `bytes` bytes that may be written on
    // `stream`.
    unsafe { memory::memset_d32_async(ptr, value, bytes / 4, stream.as_raw())? };
    Ok(())
}

/// The 32-bit words of `[ptr, ptr + bytes)`, copied on `stream` (which is synchronized).
fn words(ptr: DevicePtr, bytes: usize, stream: CudaStreamView<'_>) -> Result<Vec<u32>, Failed> {
    let mut host = vec![0u8; bytes];
    // SAFETY: `ptr` is a live allocation of at least `bytes` bytes, readable on `stream`.
    unsafe { memory::copy_to_host_sync(&mut host, ptr, stream.as_raw())? };
    Ok(host
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect())
}

fn all_equal(
    ptr: DevicePtr,
    bytes: usize,
    value: u32,
    stream: CudaStreamView<'_>,
) -> Result<(), Failed> {
    let found = words(ptr, bytes, stream)?;
    match found.iter().position(|&w| w != value) {
        None => Ok(()),
        Some(i) => Err(format!(
            "word {i} of {ptr} is {:#010x}, expected {value:#010x}",
            found[i]
        )
        .into()),
    }
}

// --- RMM's resource cases ---------------------------------------------------------------------

/// RMM `SizeSmallerThanSuperblockSize`.
fn size_smaller_than_superblock() -> Result<(), Failed> {
    let e = Arena::with_options(
        CudaMemoryResource::new(),
        ArenaOptions::new().arena_size(256),
    )
    .unwrap_err();
    ensure(matches!(e, MrError::InvalidArgument(_)), format!("{e}"))
}

/// RMM `AllocateNinetyPercent`.
fn allocate_ninety_percent() -> Result<(), Failed> {
    let size = rmm_sys::percent_of_free_device_memory(90)?;
    let mr = arena(size)?;
    ensure(mr.arena_size() == size, "arena size")?;
    let p = mr.allocate_sync(256, 256)?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate_sync(p, 256, 256)? };
    Ok(())
}

/// RMM `SmallMediumLarge`, on the default arena size (half of the free memory).
fn small_medium_large() -> Result<(), Failed> {
    let mr = Arena::new(CudaMemoryResource::new())?;
    let small = mr.allocate_sync(256, 256)?;
    let medium = mr.allocate_sync(64 * MIB, 256)?;
    let third = rmm_sys::available_device_memory()?.0 / 3;
    let large = mr.allocate_sync(third, 256)?;
    // SAFETY: all three came from `mr` with these sizes.
    unsafe {
        mr.deallocate_sync(small, 256, 256)?;
        mr.deallocate_sync(medium, 64 * MIB, 256)?;
        mr.deallocate_sync(large, third, 256)?;
    }
    Ok(())
}

/// RMM `Defragment`: four threads leave superblocks in their streams' arenas; an allocation of
/// the whole arena then succeeds through defragmentation.
fn defragment() -> Result<(), Failed> {
    let size = 4 * MIB;
    let mr = arena(size)?;
    std::thread::scope(|s| -> Result<(), Failed> {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    let stream = CudaStream::with_default_flags().map_err(|e| e.to_string())?;
                    let p = mr
                        .allocate(stream.view(), 32 * KIB, 256)
                        .map_err(|e| e.to_string())?;
                    free(&mr, stream.view(), p, 32 * KIB).map_err(|e| format!("{e:?}"))
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "thread panicked")??;
        }
        Ok(())
    })?;
    let p = mr.allocate_sync(size, 256)?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate_sync(p, size, 256)? };
    Ok(())
}

/// RMM `PerThreadToStreamDealloc`: a block from a per-thread arena whose superblock moved to
/// the global arena (defragmentation) and then to another arena can still be freed from the
/// per-thread stream.
fn per_thread_to_stream_dealloc() -> Result<(), Failed> {
    let mr = arena(2 * MIB)?;
    let per_thread = CudaStreamView::per_thread();
    let default = CudaStreamView::default();
    let thread_ptr = mr.allocate(per_thread, 256, 256)?;
    let stream = CudaStream::with_default_flags()?;
    let p = mr.allocate(stream.view(), 32 * KIB, 256)?;
    free(&mr, stream.view(), p, 32 * KIB)?;
    let ptr1 = mr.allocate(default, MIB, 256)?;
    let ptr2 = mr.allocate(default, 32 * KIB, 256)?;
    free(&mr, per_thread, thread_ptr, 256)?;
    free(&mr, default, ptr1, MIB)?;
    free(&mr, default, ptr2, 32 * KIB)?;
    let whole = mr.allocate(default, 2 * MIB, 256)?;
    free(&mr, default, whole, 2 * MIB)
}

/// RMM `DumpLogOnFailure`: an 8 MiB request in a 1 MiB arena is out of memory; the dump
/// describes the arena.
fn dump_log_on_failure() -> Result<(), Failed> {
    let mr = Arena::with_options(
        CudaMemoryResource::new(),
        ArenaOptions::new()
            .arena_size(MIB)
            .dump_log_on_failure(true),
    )?;
    // One thread after another: the arena has a single superblock, so threads racing for it in
    // per-thread mode can each exhaust their one defragment-and-retry (RMM's rule) and fail.
    for _ in 0..4 {
        std::thread::scope(|s| -> Result<(), Failed> {
            s.spawn(|| -> Result<(), MrError> {
                let p = mr.allocate_sync(32 * KIB, 256)?;
                // SAFETY: `p` came from `mr`.
                unsafe { mr.deallocate_sync(p, 32 * KIB, 256) }
            })
            .join()
            .map_err(|_| "thread panicked")??;
            Ok(())
        })?;
    }
    let e = mr.allocate_sync(8 * MIB, 256).unwrap_err();
    ensure(e.is_out_of_memory(), format!("{e}"))?;
    let dump = mr.memory_dump();
    ensure(dump.contains("Arena size: 1024.000000 KiB"), dump)
}

// --- stream ordering, checked through memory contents ----------------------------------------

const A_PATTERN: u32 = 0xaaaa_0001;
const B_PATTERN: u32 = 0xbbbb_0002;

/// Stream A writes a block late (stalled), frees it on A; stream B gets the same block and
/// writes it. After both streams finish the block must hold B's pattern. With `destroy_a`, A
/// is destroyed right after the free.
fn freed_block_reused_by_another_stream(
    arena_size: usize,
    bytes: usize,
    destroy_a: bool,
) -> Result<(), Failed> {
    let mr = arena(arena_size)?;
    let mut a = Some(CudaStream::non_blocking()?);
    let b = CudaStream::non_blocking()?;
    let av = a.as_ref().ok_or("stream A")?.view();
    let p = mr.allocate(av, bytes, 256)?;
    stall(av, STALL)?;
    set(p, bytes, A_PATTERN, av)?;
    free(&mr, av, p, bytes)?;
    if destroy_a {
        a = None;
    }
    let q = mr.allocate(b.view(), bytes, 256)?;
    ensure(
        q == p,
        format!("the test needs the block reused: {p} then {q}"),
    )?;
    set(q, bytes, B_PATTERN, b.view())?;
    b.synchronize()?;
    if let Some(a) = &a {
        a.synchronize()?;
    }
    all_equal(q, bytes, B_PATTERN, b.view())?;
    free(&mr, b.view(), q, bytes)
}

/// A small block (the arena is one superblock: B gets it through defragmentation).
fn small_block_freed_on_stalled_stream() -> Result<(), Failed> {
    freed_block_reused_by_another_stream(MIB, 256 * KIB, false)
}

/// A large block (a pending free until A's event completes).
fn large_block_freed_on_stalled_stream() -> Result<(), Failed> {
    freed_block_reused_by_another_stream(4 * MIB, 3 * MIB, false)
}

/// Both, freed on a stream that is destroyed right after the free.
fn blocks_freed_on_destroyed_stream() -> Result<(), Failed> {
    freed_block_reused_by_another_stream(MIB, 256 * KIB, true)?;
    freed_block_reused_by_another_stream(4 * MIB, 3 * MIB, true)
}

/// Streams made, used and destroyed one after the other in a 2 MiB arena. Each writes a block
/// late (behind a stall) and frees it, and leaves another block live when it is destroyed:
/// the next stream's arena retires the destroyed stream's into the holding arena, whose
/// superblocks reach other streams only through a reclaim (after a device synchronization).
/// Every stream's new block must keep its pattern after all work is done (a block handed out
/// before the destroyed stream's late write would get it), the live block of the destroyed
/// stream keeps its contents and is freed on the next stream, and at the end the whole arena
/// is allocatable in one block.
fn destroyed_streams_arenas_are_retired() -> Result<(), Failed> {
    const ROUNDS: u32 = 8;
    const BLOCK: usize = 256 * KIB;
    const KEPT: usize = 64 * KIB;
    let size = 2 * MIB;
    let mr = arena(size)?;
    let mut carried: Option<(DevicePtr, u32)> = None;
    for round in 0..ROUNDS {
        let s = CudaStream::non_blocking()?;
        let v = s.view();
        let q = mr.allocate(v, BLOCK, 256)?;
        let pattern = 0x5eed_0000 | round;
        set(q, BLOCK, pattern, v)?;
        // Every late write of the destroyed streams is done.
        rmm_sys::device_synchronize()?;
        all_equal(q, BLOCK, pattern, v)?;
        if let Some((c, kept_pattern)) = carried.take() {
            // Allocated on the previous stream, destroyed since.
            all_equal(c, KEPT, kept_pattern, v)?;
            free(&mr, v, c, KEPT)?;
        }
        let c = mr.allocate(v, KEPT, 256)?;
        set(c, KEPT, !pattern, v)?;
        carried = Some((c, !pattern));
        // A late write, then the free: the block may not go to another stream before the
        // write is done.
        stall(v, STALL)?;
        set(q, BLOCK, 0xdead_0000 | round, v)?;
        free(&mr, v, q, BLOCK)?;
        drop(s);
    }
    let s = CudaStream::non_blocking()?;
    if let Some((c, kept_pattern)) = carried.take() {
        rmm_sys::device_synchronize()?;
        all_equal(c, KEPT, kept_pattern, s.view())?;
        free(&mr, s.view(), c, KEPT)?;
    }
    let all = mr.allocate(s.view(), size, 256)?;
    free(&mr, s.view(), all, size)
}

/// A block of `owner`'s arena used and freed (late, stalled) on `other`; `owner` allocates the
/// same block again and writes it: the owner's stream must wait for `other`'s free.
fn cross_arena_free(owner: CudaStreamView<'_>, other: CudaStreamView<'_>) -> Result<(), Failed> {
    let mr = arena(4 * MIB)?;
    let bytes = 64 * KIB;
    let p = mr.allocate(owner, bytes, 256)?;
    owner.synchronize()?;
    stall(other, STALL)?;
    set(p, bytes, B_PATTERN, other)?;
    free(&mr, other, p, bytes)?;
    let q = mr.allocate(owner, bytes, 256)?;
    ensure(
        q == p,
        format!("the test needs the block reused: {p} then {q}"),
    )?;
    set(q, bytes, A_PATTERN, owner)?;
    owner.synchronize()?;
    other.synchronize()?;
    all_equal(q, bytes, A_PATTERN, owner)?;
    free(&mr, owner, q, bytes)
}

/// Allocated on stream A's arena, freed on stream B.
fn stream_to_stream_free() -> Result<(), Failed> {
    let a = CudaStream::non_blocking()?;
    let b = CudaStream::non_blocking()?;
    cross_arena_free(a.view(), b.view())
}

/// Allocated on the per-thread stream, freed on an owned stream.
fn per_thread_to_owned_stream_free() -> Result<(), Failed> {
    let s = CudaStream::non_blocking()?;
    cross_arena_free(CudaStreamView::per_thread(), s.view())
}

/// A thread's per-thread arena goes back to the global arena when the thread exits.
fn thread_exit_returns_superblocks() -> Result<(), Failed> {
    let mr = arena(4 * MIB)?;
    let worker = mr.clone();
    std::thread::spawn(move || -> Result<(), String> {
        let s = CudaStreamView::per_thread();
        let p = worker
            .allocate(s, 512 * KIB, 256)
            .map_err(|e| e.to_string())?;
        set(p, 512 * KIB, A_PATTERN, s).map_err(|e| format!("{e:?}"))?;
        free(&worker, s, p, 512 * KIB).map_err(|e| format!("{e:?}"))
    })
    .join()
    .map_err(|_| "thread panicked")??;
    let dump = mr.memory_dump();
    ensure(
        dump.contains("superblocks lent: 0 ") && dump.contains("Local arenas: 0"),
        dump,
    )
}

// --- cross-thread frees on the per-thread default stream --------------------------------------
//
// Thread 1 allocates on its per-thread stream and queues work behind a stall; thread 2 frees
// the block on its own per-thread stream and reallocates the same size (see
// `cross_thread/mod.rs`). Each case puts the block where a free used to make it reusable by
// thread 2 at once.

/// Where thread 1's block is when thread 2 frees it.
#[derive(Debug, Clone, Copy)]
enum ArenaCrossThread {
    /// A large block of the global arena: thread 2's arena would keep its superblock and
    /// reuse it for its next large request.
    Large,
    /// A small block whose superblock is back in the global arena (defragmentation): it would
    /// be a pending free behind an event on thread 2's idle stream, released at once, its
    /// superblock coalesced and lent to thread 2's arena.
    GlobalSuperblock,
}

impl ArenaCrossThread {
    const ALL: [Self; 2] = [Self::Large, Self::GlobalSuperblock];

    fn name(self) -> &'static str {
        match self {
            Self::Large => "large",
            Self::GlobalSuperblock => "global_superblock",
        }
    }
}

fn arena_cross_thread_free(
    case: ArenaCrossThread,
    stream: cross_thread::PtStream,
    pending: cross_thread::Pending,
) -> Result<(), Failed> {
    use cross_thread::Reuse;
    let small = 256 * KIB;
    // Defragmentation, asked for by thread 2 before thread 1 queues its work: a request of the
    // whole arena fails (thread 1's block is live) after the reclaim and the defragmentation
    // synchronized the device and every local arena went back to the global arena.
    // (A third case, a partially used superblock lent to thread 2's arena, cannot arise since
    // the arena lends only fresh, empty superblocks: docs/internals/arena.md.)
    let defragment = |mr: &Arena| -> Result<(), Failed> {
        match mr.allocate(stream.view(), 2 * MIB, 256) {
            Err(e) if e.is_out_of_memory() => Ok(()),
            Err(e) => Err(e.into()),
            Ok(p) => {
                free(mr, stream.view(), p, 2 * MIB)?;
                Err("setup: the whole 2 MiB arena was served while a block was live".into())
            }
        }
    };
    match case {
        ArenaCrossThread::Large => {
            let mr = arena(64 * MIB)?;
            cross_thread::run(&mr, 4 * MIB, stream, pending, Reuse::Any, &|_| {
                Ok(Vec::new())
            })
        }
        ArenaCrossThread::GlobalSuperblock => {
            let mr = arena(2 * MIB)?;
            cross_thread::run(&mr, small, stream, pending, Reuse::Any, &|_| {
                defragment(&mr)?;
                Ok(Vec::new())
            })
        }
    }
}

// --- 16 threads -------------------------------------------------------------------------------

/// Checks the first, middle and last word of a block.
fn spot_check(
    ptr: DevicePtr,
    bytes: usize,
    value: u32,
    stream: CudaStreamView<'_>,
) -> Result<(), Failed> {
    let last = (bytes / 4 - 1) * 4;
    for offset in [0, (bytes / 8) * 4, last] {
        let at = ptr.checked_add(offset).ok_or("address overflow")?;
        let w = words(at, 4, stream)?;
        ensure(
            w[0] == value,
            format!("{ptr} + {offset}: {:#010x}, expected {value:#010x}", w[0]),
        )?;
    }
    Ok(())
}

/// 16 threads, each with its own stream, allocate (1 B to 4 MiB) and free at random, writing a
/// per-allocation pattern and checking it before every free; frees happen on the thread's
/// stream or its per-thread default stream (a cross-arena free). At the end the whole arena
/// can be allocated again.
fn sixteen_threads_random() -> Result<(), Failed> {
    let size = GIB.min(rmm_sys::percent_of_free_device_memory(50)?);
    let mr = arena(size)?;
    std::thread::scope(|s| -> Result<(), Failed> {
        let handles: Vec<_> = (0..16u32)
            .map(|t| {
                let mr = &mr;
                s.spawn(move || -> Result<(), String> {
                    let run = || -> Result<(), Failed> {
                        let stream = CudaStream::non_blocking()?;
                        let v = stream.view();
                        let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ u64::from(t + 1));
                        let mut live: Vec<(DevicePtr, usize, u32)> = Vec::new();
                        for step in 0..300u32 {
                            if live.len() < 12 && rng.below(3) != 0 {
                                let bytes = if rng.below(4) == 0 {
                                    MIB + 4 + rng.below(3 * MIB)
                                } else {
                                    4 + rng.below(64 * KIB)
                                };
                                let p = match mr.allocate(v, bytes, 256) {
                                    Ok(p) => p,
                                    Err(e) if e.is_out_of_memory() => continue,
                                    Err(e) => return Err(e.into()),
                                };
                                let tag = (t << 24) | step;
                                set(p, bytes, tag, v)?;
                                live.push((p, bytes, tag));
                            } else if !live.is_empty() {
                                let (p, bytes, tag) = live.swap_remove(rng.below(live.len()));
                                spot_check(p, bytes, tag, v)?;
                                let on = if rng.below(4) == 0 {
                                    CudaStreamView::per_thread()
                                } else {
                                    v
                                };
                                free(mr, on, p, bytes)?;
                            }
                        }
                        for (p, bytes, tag) in live {
                            spot_check(p, bytes, tag, v)?;
                            free(mr, v, p, bytes)?;
                        }
                        Ok(())
                    };
                    run().map_err(|e| format!("thread {t}: {e:?}"))
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "thread panicked")??;
        }
        Ok(())
    })?;
    let whole = mr.allocate_sync(mr.arena_size(), 256)?;
    // SAFETY: `whole` came from `mr`.
    unsafe { mr.deallocate_sync(whole, mr.arena_size(), 256)? };
    Ok(())
}

const GIB: usize = 1 << 30;

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![
        gpu(
            "arena::size_smaller_than_superblock",
            size_smaller_than_superblock,
        ),
        gpu("arena::allocate_ninety_percent", allocate_ninety_percent),
        gpu("arena::small_medium_large", small_medium_large),
        gpu("arena::defragment", defragment),
        gpu(
            "arena::per_thread_to_stream_dealloc",
            per_thread_to_stream_dealloc,
        ),
        gpu("arena::dump_log_on_failure", dump_log_on_failure),
        gpu(
            "arena::small_block_freed_on_stalled_stream",
            small_block_freed_on_stalled_stream,
        ),
        gpu(
            "arena::large_block_freed_on_stalled_stream",
            large_block_freed_on_stalled_stream,
        ),
        gpu(
            "arena::blocks_freed_on_destroyed_stream",
            blocks_freed_on_destroyed_stream,
        ),
        gpu(
            "arena::destroyed_streams_arenas_are_retired",
            destroyed_streams_arenas_are_retired,
        ),
        gpu("arena::stream_to_stream_free", stream_to_stream_free),
        gpu(
            "arena::per_thread_to_owned_stream_free",
            per_thread_to_owned_stream_free,
        ),
        gpu(
            "arena::thread_exit_returns_superblocks",
            thread_exit_returns_superblocks,
        ),
        gpu("arena::sixteen_threads_random", sixteen_threads_random),
    ];
    for case in ArenaCrossThread::ALL {
        for stream in cross_thread::PtStream::ALL {
            for pending in cross_thread::Pending::ALL {
                trials.push(gpu_pt(
                    format!(
                        "cross_thread_free/arena/{}/{}/{}",
                        case.name(),
                        stream.name(),
                        pending.name()
                    ),
                    stream,
                    move || arena_cross_thread_free(case, stream, pending),
                ));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
