//! GPU tests of allocation under stream capture: graph-private pools (`GraphPool`) behind the
//! pool, arena, binning, fixed-size and VMM pool resources and an adaptor stack, and graph
//! memory nodes of the driver's pool. Each resource captures a step (allocations, memset nodes,
//! a PTX kernel, frees) on a non-blocking stream in global capture mode while two other threads
//! allocate and free from the same resource, replays it 1,000 times and checks the sums, that
//! no block of the graph was handed to the other threads, and that everything went back.
//! Without a GPU every trial reports itself ignored, with the reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use libtest_mimic::{Arguments, Failed};
use rmm_mr::{
    shared, ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions,
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, FixedSizeMemoryResource,
    FixedSizeOptions, GraphPool, GraphPoolOptions, LimitingResourceAdaptor, MrError,
    PoolMemoryResource, PoolOptions, SharedResource, StatisticsResourceAdaptor,
    VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::{CudaEvent, CudaStream, CudaStreamView, StreamCapture};
use rmm_sys::kernel::AddKernel;
use rmm_sys::testing::{ensure, gpu, gpu_if, no_pools, no_vmm};
use rmm_sys::{memory, CaptureMode, DevicePtr};

const MIB: usize = 1 << 20;
/// Words of every buffer of the step.
const WORDS: usize = 1 << 16;
/// Bytes of every buffer of the step (256 KiB).
const BYTES: usize = WORDS * 4;
const LAUNCHES: u32 = 1000;

/// `out = x + y` over [`WORDS`] words, on `s`.
fn add(
    k: &AddKernel,
    out: DevicePtr,
    x: DevicePtr,
    y: DevicePtr,
    s: CudaStreamView<'_>,
) -> Result<(), Failed> {
    // SAFETY: the callers pass live allocations of `BYTES` usable on `s`; the kernel outlives
    // every launch (the callers synchronize before dropping it).
    unsafe { k.launch(out, x, y, WORDS as u32, s.as_raw())? };
    Ok(())
}

fn memset(ptr: DevicePtr, value: u32, s: CudaStreamView<'_>) -> Result<(), Failed> {
    // SAFETY: the callers pass a live allocation of `BYTES` usable on `s`.
    unsafe { memory::memset_d32_async(ptr, value, WORDS, s.as_raw())? };
    Ok(())
}

/// Copies the [`WORDS`] words at `ptr` back (synchronizing `s`) and checks they all equal
/// `value`.
fn expect_words(ptr: DevicePtr, value: u32, s: CudaStreamView<'_>) -> Result<(), Failed> {
    let mut host = vec![0u8; BYTES];
    // SAFETY: `ptr` is a live allocation of `BYTES`; the copy synchronizes `s`.
    unsafe { memory::copy_to_host_sync(&mut host, ptr, s.as_raw())? };
    let bad = host
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .enumerate()
        .find(|&(_, w)| w != value);
    match bad {
        None => Ok(()),
        Some((i, w)) => Err(format!("word {i} is {w}, expected {value}").into()),
    }
}

fn alloc(mr: &dyn DeviceMemoryResource, s: CudaStreamView<'_>) -> Result<DevicePtr, Failed> {
    Ok(mr.allocate(s, BYTES, 256)?)
}

fn free(mr: &dyn DeviceMemoryResource, s: CudaStreamView<'_>, p: DevicePtr) -> Result<(), Failed> {
    // SAFETY: `p` came from `mr` with these arguments; the work using it is ordered before on
    // `s` (or on a stream joined into `s`).
    unsafe { mr.deallocate(s, p, BYTES, 256)? };
    Ok(())
}

/// The captured step: `acc += 7` through three buffers, the third allocated after the first
/// was freed on the same stream. Returns the three buffers' addresses.
fn step(
    mr: &dyn DeviceMemoryResource,
    k: &AddKernel,
    acc: DevicePtr,
    s: CudaStreamView<'_>,
) -> Result<[DevicePtr; 3], Failed> {
    let a = alloc(mr, s)?;
    memset(a, 1, s)?;
    let b = alloc(mr, s)?;
    memset(b, 2, s)?;
    add(k, b, a, b, s)?; // b = 3
    free(mr, s, a)?;
    let c = alloc(mr, s)?;
    memset(c, 4, s)?;
    add(k, c, b, c, s)?; // c = 7
    add(k, acc, acc, c, s)?; // acc += 7
    free(mr, s, b)?;
    free(mr, s, c)?;
    Ok([a, b, c])
}

/// A neighbour thread: every address range it was given, or what failed.
type Neighbour = thread::JoinHandle<Result<Vec<(u64, u64)>, String>>;

/// Threads that allocate and free from `mr` on streams of their own (one on the default
/// stream) until stopped, and return every range they were given.
fn neighbours(mr: SharedResource, stop: Arc<AtomicBool>) -> Vec<Neighbour> {
    (0..2)
        .map(|t| {
            let mr = mr.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                let own = CudaStream::non_blocking().map_err(|e| e.to_string())?;
                let s = if t == 0 {
                    CudaStreamView::default()
                } else {
                    own.view()
                };
                let mut seen = Vec::new();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let bytes = BYTES / 4 * (1 + i % 4);
                    i += 1;
                    let p = mr.allocate(s, bytes, 256).map_err(|e| e.to_string())?;
                    seen.push((p.addr(), p.addr() + bytes as u64));
                    // SAFETY: just allocated with these arguments; nothing used it.
                    unsafe { mr.deallocate(s, p, bytes, 256) }.map_err(|e| e.to_string())?;
                }
                s.synchronize().map_err(|e| e.to_string())?;
                Ok(seen)
            })
        })
        .collect()
}

/// How one resource case is built: the resource the step allocates from, the graph pool's
/// upstream (counted) and whether graph blocks come from the graph pool (not the driver's
/// graph memory nodes).
struct Case {
    routed: SharedResource,
    upstream: Arc<StatisticsResourceAdaptor<SharedResource>>,
    chunk_size: usize,
    graph_pool_serves: bool,
    /// Counts what the routed resource's callers hold (an adaptor stack's top), if any.
    top: Option<Arc<StatisticsResourceAdaptor<SharedResource>>>,
}

fn case(routed: SharedResource) -> Case {
    Case {
        upstream: Arc::new(StatisticsResourceAdaptor::new(routed.clone())),
        routed,
        chunk_size: 8 * MIB,
        graph_pool_serves: true,
        top: None,
    }
}

fn cuda() -> SharedResource {
    shared(CudaMemoryResource::new())
}

fn pool(initial: usize) -> Result<SharedResource, Failed> {
    Ok(shared(PoolMemoryResource::with_options(
        cuda(),
        PoolOptions::new(initial),
    )?))
}

fn make(name: &str) -> Result<Case, Failed> {
    Ok(match name {
        "pool" => case(pool(256 * MIB)?),
        "arena" => case(shared(ArenaMemoryResource::with_options(
            cuda(),
            ArenaOptions::new().arena_size(256 * MIB),
        )?)),
        "binning" => case(shared(BinningMemoryResource::with_options(
            pool(256 * MIB)?,
            BinningOptions::new()
                .min_size_exponent(16)
                .max_size_exponent(18),
        )?)),
        "fixed_size" => Case {
            chunk_size: BYTES,
            ..case(shared(FixedSizeMemoryResource::with_options(
                cuda(),
                FixedSizeOptions::new()
                    .block_size(BYTES)
                    .blocks_to_preallocate(256),
            )?))
        },
        "vmm_pool" => case(shared(VmmPoolMemoryResource::with_options(
            VmmPoolOptions::new(1024 * MIB).initial_pool_size(256 * MIB),
        )?)),
        "cuda_async" => Case {
            graph_pool_serves: false,
            ..case(shared(CudaAsyncMemoryResource::new()?))
        },
        "adaptor_stack" => {
            let inner = pool(256 * MIB)?;
            let top = Arc::new(StatisticsResourceAdaptor::new(shared(
                LimitingResourceAdaptor::new(inner.clone(), 1024 * MIB),
            )));
            Case {
                routed: top.clone(),
                top: Some(top),
                ..case(inner)
            }
        }
        other => return Err(format!("no case {other}").into()),
    })
}

/// Capture the step with other threads allocating beside it, replay it [`LAUNCHES`] times,
/// check the sum, the reuse in capture order, that the other threads never got a graph block,
/// and that everything went back.
fn replays(name: &'static str) -> Result<(), Failed> {
    let c = make(name)?;
    let k = AddKernel::load()?;
    let stream = CudaStream::non_blocking()?;
    let s = stream.view();
    let acc = c.routed.allocate(s, BYTES, 256)?;
    memset(acc, 0, s)?;
    s.synchronize()?;
    let gp = GraphPool::with_options(
        c.upstream.clone(),
        GraphPoolOptions::new().chunk_size(c.chunk_size),
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let threads = neighbours(c.routed.clone(), stop.clone());
    let captured = (|| {
        let scope = gp.capture(s)?;
        let blocks = step(&*c.routed, &k, acc, s)?;
        let graph = scope.end()?;
        Ok::<_, Failed>((graph, blocks))
    })();
    let result = captured.and_then(|(graph, blocks)| {
        let nodes = graph.node_count()?;
        let exec = graph.instantiate(0)?;
        drop(graph);
        for _ in 0..LAUNCHES {
            exec.launch(s)?;
        }
        expect_words(acc, 7 * LAUNCHES, s)?;
        Ok::<_, Failed>((exec, blocks, nodes))
    });
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for t in threads {
        seen.extend(t.join().map_err(|_| "a neighbour thread panicked")??);
    }
    let (exec, [a, b, c3], nodes) = result?;
    // Three memsets and three kernels; with the driver's pool, three allocation and three free
    // nodes as well.
    let expected_nodes = if c.graph_pool_serves { 6 } else { 12 };
    ensure(
        nodes == expected_nodes,
        format!("the graph has {nodes} nodes, expected {expected_nodes}"),
    )?;
    ensure(!seen.is_empty(), "the neighbour threads allocated nothing")?;
    if c.graph_pool_serves {
        ensure(
            c3 == a,
            format!("the third block {c3} did not reuse the freed first {a}"),
        )?;
        ensure(gp.reserved_bytes() > 0, "the graph pool reserved nothing")?;
        ensure(
            gp.in_use_bytes() == 0,
            "the graph pool holds blocks after the step",
        )?;
    } else {
        ensure(
            gp.reserved_bytes() == 0,
            "the driver pool's allocations were routed",
        )?;
    }
    for &g in &[a, b, c3] {
        let (lo, hi) = (g.addr(), g.addr() + BYTES as u64);
        if let Some(&(x, y)) = seen.iter().find(|&&(x, y)| x < hi && lo < y) {
            return Err(format!(
                "graph block {g} overlaps {x:#x}..{y:#x}, handed to another thread"
            )
            .into());
        }
    }
    drop(exec);
    drop(gp);
    free(&*c.routed, s, acc)?;
    s.synchronize()?;
    let left = c.upstream.bytes_counter().value;
    ensure(
        left == 0,
        format!("{left} bytes of the graph pool were not given back"),
    )?;
    if let Some(top) = &c.top {
        let held = top.bytes_counter().value;
        ensure(
            held == 0,
            format!("the stack's top still counts {held} bytes"),
        )?;
    }
    if !c.graph_pool_serves {
        rmm_sys::graph::device_graph_mem_trim(rmm_sys::current_device()?)?;
    }
    Ok(())
}

/// A capture forked to a second stream and joined back: blocks allocated on either stream
/// come from the graph pool, the sum is right after 1,000 replays.
fn fork_join(name: &'static str) -> Result<(), Failed> {
    let c = make(name)?;
    let k = AddKernel::load()?;
    let (s1, s2) = (CudaStream::non_blocking()?, CudaStream::non_blocking()?);
    let (v1, v2) = (s1.view(), s2.view());
    let acc = c.routed.allocate(v1, BYTES, 256)?;
    memset(acc, 0, v1)?;
    v1.synchronize()?;
    let gp = GraphPool::with_options(
        c.upstream.clone(),
        GraphPoolOptions::new().chunk_size(c.chunk_size),
    )?;
    let (fork, join) = (CudaEvent::new()?, CudaEvent::new()?);
    let scope = gp.capture(v1)?;
    fork.record(v1)?;
    fork.wait(v2)?;
    let x = alloc(&*c.routed, v2)?;
    memset(x, 5, v2)?;
    let y = alloc(&*c.routed, v1)?;
    memset(y, 1, v1)?;
    join.record(v2)?;
    join.wait(v1)?;
    add(&k, acc, acc, x, v1)?;
    add(&k, acc, acc, y, v1)?;
    free(&*c.routed, v1, x)?;
    free(&*c.routed, v1, y)?;
    let graph = scope.end()?;
    let exec = graph.instantiate(0)?;
    for _ in 0..LAUNCHES {
        exec.launch(v1)?;
    }
    expect_words(acc, 6 * LAUNCHES, v1)?;
    ensure(x != y, "the two streams got one block")?;
    if c.graph_pool_serves {
        ensure(
            gp.reserved_bytes() >= 2 * BYTES,
            "the graph pool did not serve both streams",
        )?;
    }
    drop((exec, graph, gp));
    free(&*c.routed, v1, acc)?;
    v1.synchronize()?;
    let left = c.upstream.bytes_counter().value;
    ensure(
        left == 0,
        format!("{left} bytes of the graph pool were not given back"),
    )
}

/// Checks that `s` is no longer capturing and still runs work.
fn stream_usable(s: CudaStreamView<'_>, mr: &dyn DeviceMemoryResource) -> Result<(), Failed> {
    ensure(!s.is_capturing()?, "the stream is still capturing")?;
    let p = alloc(mr, s)?;
    memset(p, 9, s)?;
    expect_words(p, 9, s)?;
    free(mr, s, p)
}

/// A captured allocation that passes the graph pool's maximum, and one that passes the
/// maximum of the pool below it: `OutOfMemory`, the capture ends cleanly, the stream is usable
/// and nothing is left.
fn over_maximum() -> Result<(), Failed> {
    // The graph pool's own maximum.
    let c = make("pool")?;
    let stream = CudaStream::non_blocking()?;
    let s = stream.view();
    let gp = GraphPool::with_options(
        c.upstream.clone(),
        GraphPoolOptions::new()
            .chunk_size(BYTES)
            .maximum_size(2 * BYTES),
    )?;
    let scope = gp.capture(s)?;
    let a = alloc(&*c.routed, s)?;
    let b = alloc(&*c.routed, s)?;
    memset(a, 1, s)?;
    let e = c.routed.allocate(s, BYTES, 256).unwrap_err();
    ensure(
        e.is_out_of_memory(),
        format!("past the graph pool's maximum: {e}"),
    )?;
    free(&*c.routed, s, a)?;
    free(&*c.routed, s, b)?;
    let graph = scope.end()?;
    graph.instantiate(0)?.launch(s)?;
    s.synchronize()?;
    stream_usable(s, &*c.routed)?;
    drop((graph, gp));
    ensure(
        c.upstream.bytes_counter().value == 0,
        "the graph pool kept memory",
    )?;

    // The maximum of the resource the graph pool reserves from.
    let limited = shared(PoolMemoryResource::with_options(
        cuda(),
        PoolOptions::new(2 * MIB).maximum_pool_size(4 * MIB),
    )?);
    let c = case(limited);
    let gp = GraphPool::with_options(c.upstream.clone(), GraphPoolOptions::new().chunk_size(MIB))?;
    let scope = gp.capture(s)?;
    let e = c.routed.allocate(s, 8 * MIB, 256).unwrap_err();
    ensure(
        e.is_out_of_memory(),
        format!("past the pool's maximum: {e}"),
    )?;
    let graph = scope.end()?;
    drop(graph);
    stream_usable(s, &*c.routed)?;
    drop(gp);
    ensure(
        c.upstream.bytes_counter().value == 0,
        "the graph pool kept memory",
    )
}

/// A capture not begun through a `GraphPool`: a pool that would have to grow refuses with
/// `MrError::Capture` and the capture stays valid; inside a graph pool's capture, freeing a
/// block allocated before it is refused the same way (and the block stays the caller's).
fn foreign_capture_and_outside_frees() -> Result<(), Failed> {
    let empty = pool(0)?;
    let stream = CudaStream::non_blocking()?;
    let s = stream.view();
    let capture = StreamCapture::begin(s, CaptureMode::Global)?;
    let e = empty.allocate(s, BYTES, 256).unwrap_err();
    ensure(
        matches!(e, MrError::Capture(_)),
        format!("growth under a foreign capture: {e}"),
    )?;
    let graph = capture.end()?;
    drop(graph);
    stream_usable(s, &*empty)?;

    let c = make("pool")?;
    let before = alloc(&*c.routed, s)?;
    s.synchronize()?;
    let gp = GraphPool::new(c.upstream.clone())?;
    let scope = gp.capture(s)?;
    // SAFETY: `before` came from this resource with these arguments; nothing uses it.
    let e = unsafe { c.routed.deallocate(s, before, BYTES, 256) }.unwrap_err();
    ensure(
        matches!(e, MrError::Capture(_)),
        format!("an outside block freed inside: {e}"),
    )?;
    let graph = scope.end()?;
    drop((graph, gp));
    free(&*c.routed, s, before)?;
    stream_usable(s, &*c.routed)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for name in ["pool", "arena", "binning", "fixed_size", "adaptor_stack"] {
        trials.push(gpu(format!("graphs::replays::{name}"), move || {
            replays(name)
        }));
        trials.push(gpu(format!("graphs::fork_join::{name}"), move || {
            fork_join(name)
        }));
    }
    trials.push(gpu_if("graphs::replays::vmm_pool", no_vmm, || {
        replays("vmm_pool")
    }));
    trials.push(gpu_if("graphs::fork_join::vmm_pool", no_vmm, || {
        fork_join("vmm_pool")
    }));
    trials.push(gpu_if("graphs::replays::cuda_async", no_pools, || {
        replays("cuda_async")
    }));
    trials.push(gpu_if("graphs::fork_join::cuda_async", no_pools, || {
        fork_join("cuda_async")
    }));
    trials.push(gpu("graphs::over_maximum", over_maximum));
    trials.push(gpu(
        "graphs::foreign_capture_and_outside_frees",
        foreign_capture_and_outside_frees,
    ));
    libtest_mimic::run(&args, trials).exit();
}
