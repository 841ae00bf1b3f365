//! The GPU integrity stress (`stress/<resource>`): 16 host threads allocate, fill, check and
//! free at random through one resource, on their own streams, on streams all threads share, on
//! their per-thread default stream and on the default stream, for every sub-allocator, the two
//! CUDA base resources and a pool under statistics and limiting adaptors.
//!
//! - Every allocation is filled **on its stream** with a pattern of its own
//!   (`cuMemsetD32Async`, `cuMemsetD8Async` for a tail of 1 to 3 bytes) and its every byte is
//!   copied back and compared before it is freed.
//! - Half of the frees leave work pending on the block (a write of the inverted pattern), so a
//!   resource that hands the block to another stream without ordering it behind that work has
//!   the write land in the new owner's bytes, which its own check then finds.
//! - Frees happen on the allocation's stream, on another stream of the same thread (after that
//!   stream waited on an event recorded behind the pending work) or on another thread (the
//!   block and the event go to that thread, which waits on the event on one of its streams and
//!   frees there). All three are legal stream-ordered frees.
//! - No two live allocations overlap: every range is registered in a host-side map from its
//!   allocation to just before its free, and an allocation that overlaps a registered range
//!   fails the trial (this check does not depend on timing).
//!
//! Each trial prints one line, `stress: <resource>: N ops (...), B bytes verified, ...`, for
//! `docs/reliability.md`. `RMM_STRESS_OPS` sets the operations per thread (default 400); the
//! sanitizer mode of the GPU runner lowers it. Without a GPU every `stress/` trial reports
//! itself ignored. Runs in both `RMM_DEFAULT_STREAM` modes in the GPU bundle, one trial at a
//! time.
//!
//! The `stress_host/` trials run the same harness over the sub-allocators on the host (a
//! host-memory upstream and rmm-sys's simulated streams and events, 60 operations per thread),
//! so CI without a GPU checks the harness itself, and one trial shows that its checks can fail.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Barrier, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use libtest_mimic::{Arguments, Failed, Trial};
use rmm_mr::testing::{HostMockResource, Rng};
use rmm_mr::{
    shared, ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions,
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, FixedSizeMemoryResource,
    FixedSizeOptions, LimitingResourceAdaptor, PoolMemoryResource, SharedResource,
    StatisticsResourceAdaptor,
};
use rmm_stream::{CudaEvent, CudaStream, CudaStreamView};
use rmm_sys::fault::FaultScope;
use rmm_sys::testing::{self, ensure, no_pools, one_at_a_time};
use rmm_sys::{memory, CudaResult, DevicePtr};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// Host threads per trial.
const THREADS: usize = 16;
/// Streams each thread creates (one non-blocking, one blocking).
const OWN_STREAMS: usize = 2;
/// Streams every thread uses.
const SHARED_STREAMS: usize = 4;
/// Allocations a thread holds at most.
const MAX_LIVE: usize = 12;
/// Operations per thread without `RMM_STRESS_OPS`.
const DEFAULT_OPS: usize = 400;
/// Operations per thread of the host slice.
const HOST_OPS: usize = 60;

/// Where a trial runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Env {
    /// On the GPU: CUDA upstreams, real streams, fills and copies by the driver.
    Gpu,
    /// On the host, so that CI without a GPU runs the harness itself and the sub-allocators
    /// under it: a host-memory upstream ([`HostMockResource`]), rmm-sys's simulated driver for
    /// streams and events (every thread turns it on for itself), and fills and checks through
    /// host pointers. Nothing is queued, so nothing is pending at a free; the checks of
    /// contents and overlaps are the same.
    Host,
}

impl Env {
    fn upstream(self) -> SharedResource {
        match self {
            Self::Gpu => shared(CudaMemoryResource::new()),
            Self::Host => shared(HostMockResource::new()),
        }
    }

    /// The largest request: `gpu` on the GPU, at most 256 KiB on the host.
    fn max_bytes(self, gpu: usize) -> usize {
        match self {
            Self::Gpu => gpu,
            Self::Host => gpu.min(256 * KIB),
        }
    }

    fn ops(self) -> Result<usize, Failed> {
        match self {
            Self::Gpu => ops_per_thread(),
            Self::Host => Ok(HOST_OPS),
        }
    }

    /// Turns the simulated driver on for the calling thread on the host (until the scope drops).
    fn scope(self) -> Option<FaultScope> {
        (self == Self::Host).then(FaultScope::simulated)
    }

    /// A stream: a new driver stream on the GPU (`blocking` or not), simulated stream `n` on
    /// the host.
    fn stream(self, n: u32, blocking: bool) -> CudaResult<Stream> {
        match self {
            Self::Gpu if blocking => CudaStream::with_default_flags().map(Stream::Real),
            Self::Gpu => CudaStream::non_blocking().map(Stream::Real),
            Self::Host => Ok(Stream::Simulated(n)),
        }
    }
}

/// A stream a trial or thread owns.
enum Stream {
    Real(CudaStream),
    Simulated(u32),
}

impl Stream {
    fn view(&self) -> CudaStreamView<'_> {
        match self {
            Self::Real(s) => s.view(),
            Self::Simulated(n) => CudaStreamView::simulated(*n),
        }
    }
}

/// Operations per thread: `RMM_STRESS_OPS` or [`DEFAULT_OPS`].
fn ops_per_thread() -> Result<usize, Failed> {
    match std::env::var("RMM_STRESS_OPS") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("RMM_STRESS_OPS={v:?} is not a positive number").into()),
        Err(_) => Ok(DEFAULT_OPS),
    }
}

/// A request size up to `max`: a tenth of them up to 256 bytes, half up to 64 KiB, three
/// tenths up to 1 MiB, a tenth above 1 MiB (when `max` allows). Sizes are not multiples of 4
/// in general, so tails are filled and checked byte by byte.
fn request_size(rng: &mut Rng, max: usize) -> usize {
    let (lo, hi) = match rng.below(10) {
        0 => (1, 256),
        1..=5 => (257, 64 * KIB),
        6..=8 => (64 * KIB + 1, MIB),
        _ => (MIB + 1, max.max(MIB + 1)),
    };
    let hi = hi.min(max);
    rng.range(lo.min(hi), hi)
}

/// Which stream an operation uses, in a thread's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    /// One of the thread's own streams.
    Own(usize),
    /// One of the streams every thread shares.
    Shared(usize),
    /// The thread's per-thread default stream.
    PerThread,
    /// The default stream (handle 0): legacy or per-thread, as `RMM_DEFAULT_STREAM` says.
    Default,
}

impl On {
    const KINDS: usize = OWN_STREAMS + SHARED_STREAMS + 2;

    fn pick(rng: &mut Rng) -> Self {
        match rng.below(Self::KINDS) {
            i if i < OWN_STREAMS => Self::Own(i),
            i if i < OWN_STREAMS + SHARED_STREAMS => Self::Shared(i - OWN_STREAMS),
            i if i == OWN_STREAMS + SHARED_STREAMS => Self::PerThread,
            _ => Self::Default,
        }
    }

    /// Another stream than `self`.
    fn other(self, rng: &mut Rng) -> Self {
        loop {
            let on = Self::pick(rng);
            if on != self {
                return on;
            }
        }
    }
}

/// A live allocation of one thread.
#[derive(Debug)]
struct Block {
    ptr: DevicePtr,
    bytes: usize,
    pattern: u32,
    /// The stream it was allocated and filled on.
    on: On,
}

/// A block sent to another thread to free: its work is behind `done`.
struct Mail {
    ptr: DevicePtr,
    bytes: usize,
    done: CudaEvent,
}

/// What a thread (or a whole trial) did.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    allocations: u64,
    /// Allocations refused with out-of-memory (only where the subject allows it).
    refused: u64,
    same_stream_frees: u64,
    cross_stream_frees: u64,
    cross_thread_frees: u64,
    /// Frees with a write still queued on the block.
    pending_frees: u64,
    bytes_allocated: u64,
    bytes_verified: u64,
}

impl Counts {
    fn add(&mut self, o: &Self) {
        self.allocations += o.allocations;
        self.refused += o.refused;
        self.same_stream_frees += o.same_stream_frees;
        self.cross_stream_frees += o.cross_stream_frees;
        self.cross_thread_frees += o.cross_thread_frees;
        self.pending_frees += o.pending_frees;
        self.bytes_allocated += o.bytes_allocated;
        self.bytes_verified += o.bytes_verified;
    }

    fn frees(&self) -> u64 {
        self.same_stream_frees + self.cross_stream_frees + self.cross_thread_frees
    }

    fn ops(&self) -> u64 {
        self.allocations + self.refused + self.frees()
    }
}

/// What every thread of a trial shares.
struct Shared<'a> {
    env: Env,
    mr: &'a dyn DeviceMemoryResource,
    /// May the resource refuse with out-of-memory (a limit the stress can reach)?
    allow_oom: bool,
    max_bytes: usize,
    /// Live ranges, `start -> end`, of every thread.
    live: Mutex<BTreeMap<u64, u64>>,
    /// One mailbox per thread: blocks other threads left it to free.
    mailboxes: Vec<Mutex<Vec<Mail>>>,
    /// Every thread has finished its operations (no mail is sent after it).
    barrier: Barrier,
    streams: &'a [Stream],
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared<'_> {
    /// Registers `[ptr, ptr + bytes)` as live; an error when it overlaps a live range.
    fn claim(&self, ptr: DevicePtr, bytes: usize) -> Result<(), String> {
        let start = ptr.addr();
        let end = start + bytes as u64;
        let mut live = lock(&self.live);
        if let Some((&s, &e)) = live.range(..end).next_back() {
            if e > start {
                return Err(format!(
                    "{ptr} + {bytes} bytes overlaps the live allocation {s:#x}..{e:#x}"
                ));
            }
        }
        live.insert(start, end);
        Ok(())
    }

    /// Unregisters the range at `ptr` (just before it is freed).
    fn release(&self, ptr: DevicePtr) -> Result<(), String> {
        match lock(&self.live).remove(&ptr.addr()) {
            Some(_) => Ok(()),
            None => Err(format!("{ptr} was not registered as live")),
        }
    }
}

/// One thread of a trial.
struct Worker<'a> {
    t: usize,
    sh: &'a Shared<'a>,
    own: Vec<Stream>,
    rng: Rng,
    live: Vec<Block>,
    counts: Counts,
    host: Vec<u8>,
    serial: u32,
}

fn text(e: impl fmt::Display) -> String {
    e.to_string()
}

impl<'a> Worker<'a> {
    fn view(&self, on: On) -> CudaStreamView<'_> {
        match on {
            // Without its own streams (creating them failed) a thread uses its per-thread one.
            On::Own(i) => self
                .own
                .get(i)
                .map_or(CudaStreamView::per_thread(), Stream::view),
            On::Shared(i) => self.sh.streams[i].view(),
            On::PerThread => CudaStreamView::per_thread(),
            On::Default => CudaStreamView::default(),
        }
    }

    fn fill(&self, ptr: DevicePtr, bytes: usize, pattern: u32, on: On) -> Result<(), String> {
        let s = self.view(on).as_raw();
        let words = bytes / 4;
        let tail = bytes % 4;
        if self.sh.env == Env::Host {
            let p = ptr.as_host_ptr::<u8>();
            // SAFETY: on the host the resource hands out host memory, and `[ptr, ptr + bytes)`
            // is a live allocation of this trial that only this thread uses now.
            unsafe {
                for i in 0..words {
                    p.add(4 * i).cast::<u32>().write_unaligned(pattern);
                }
                std::ptr::write_bytes(p.add(4 * words), pattern as u8, tail);
            }
            return Ok(());
        }
        // SAFETY: `[ptr, ptr + bytes)` is a live allocation of this trial that the caller
        // may write on this stream (it was allocated on it, or this write is ordered before the
        // free that follows on it).
        unsafe {
            if words > 0 {
                memory::memset_d32_async(ptr, pattern, words, s).map_err(text)?;
            }
            if tail > 0 {
                let at = ptr
                    .checked_add(words * 4)
                    .ok_or("the tail address overflows")?;
                memory::memset_d8_async(at, pattern as u8, tail, s).map_err(text)?;
            }
        }
        Ok(())
    }

    /// Copies the block back on its stream and compares every byte with its pattern.
    fn check(&mut self, b: &Block) -> Result<(), String> {
        if self.host.len() < b.bytes {
            self.host.resize(b.bytes, 0);
        }
        let s = self.view(b.on).as_raw();
        let host = &mut self.host[..b.bytes];
        if self.sh.env == Env::Host {
            // SAFETY: on the host `b` is host memory, live and `b.bytes` long, used only by
            // this thread now.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    b.ptr.as_host_ptr::<u8>(),
                    host.as_mut_ptr(),
                    b.bytes,
                );
            }
        } else {
            // SAFETY: `b` is live, `b.bytes` long and was written on its stream `s`.
            unsafe { memory::copy_to_host_sync(host, b.ptr, s) }.map_err(text)?;
        }
        let word = b.pattern.to_ne_bytes();
        let words = b.bytes / 4;
        let bad = host
            .chunks_exact(4)
            .position(|w| w != word)
            .map(|i| (i * 4, &host[i * 4..i * 4 + 4]))
            .or_else(|| {
                host[words * 4..]
                    .iter()
                    .position(|&x| x != b.pattern as u8)
                    .map(|i| (words * 4 + i, &host[words * 4 + i..words * 4 + i + 1]))
            });
        if let Some((at, got)) = bad {
            return Err(format!(
                "thread {}: byte {at} of the {}-byte block {} (allocated on {:?}) holds {got:02x?}, \
                 expected the pattern {:#010x}: another allocation or pending work wrote into it",
                self.t, b.bytes, b.ptr, b.on, b.pattern
            ));
        }
        self.counts.bytes_verified += b.bytes as u64;
        Ok(())
    }

    fn free_on(&mut self, ptr: DevicePtr, bytes: usize, on: On) -> Result<(), String> {
        self.sh.release(ptr)?;
        let s = self.view(on);
        // SAFETY: `ptr` came from the trial's resource with `bytes` and is freed once; its
        // pending work is ordered before this point of `s` (same stream or an event wait).
        unsafe { self.sh.mr.deallocate(s, ptr, bytes, 256) }
            .map_err(|e| format!("free of {ptr} ({bytes} bytes) on {on:?}: {e}"))
    }

    fn allocate(&mut self) -> Result<(), String> {
        let on = On::pick(&mut self.rng);
        let bytes = request_size(&mut self.rng, self.sh.max_bytes);
        let ptr = match self.sh.mr.allocate(self.view(on), bytes, 256) {
            Ok(p) => p,
            Err(e) if self.sh.allow_oom && e.is_out_of_memory() => {
                self.counts.refused += 1;
                return Ok(());
            }
            Err(e) => return Err(format!("allocation of {bytes} bytes on {on:?}: {e}")),
        };
        if ptr.is_null() || !ptr.is_aligned(256) {
            return Err(format!(
                "{bytes} bytes gave {ptr}, not a 256-aligned address"
            ));
        }
        self.sh.claim(ptr, bytes)?;
        self.serial = self.serial.wrapping_add(1);
        let pattern = ((self.t as u32) << 24) | (self.serial & 0x00ff_ffff);
        self.fill(ptr, bytes, pattern, on)?;
        self.live.push(Block {
            ptr,
            bytes,
            pattern,
            on,
        });
        self.counts.allocations += 1;
        self.counts.bytes_allocated += bytes as u64;
        Ok(())
    }

    /// Checks a random live block, maybe queues a write on it, and frees it here, on another
    /// stream or on another thread.
    fn free_one(&mut self) -> Result<(), String> {
        let b = self.live.swap_remove(self.rng.below(self.live.len()));
        self.check(&b)?;
        if self.rng.below(2) == 0 {
            self.fill(b.ptr, b.bytes, !b.pattern, b.on)?;
            self.counts.pending_frees += 1;
        }
        match self.rng.below(4) {
            0 | 1 => {
                self.free_on(b.ptr, b.bytes, b.on)?;
                self.counts.same_stream_frees += 1;
            }
            2 => {
                let to = b.on.other(&mut self.rng);
                let done = CudaEvent::new().map_err(text)?;
                done.record(self.view(b.on)).map_err(text)?;
                done.wait(self.view(to)).map_err(text)?;
                self.free_on(b.ptr, b.bytes, to)?;
                self.counts.cross_stream_frees += 1;
            }
            _ => {
                let done = CudaEvent::new().map_err(text)?;
                done.record(self.view(b.on)).map_err(text)?;
                let to = (self.t + 1 + self.rng.below(THREADS - 1)) % THREADS;
                lock(&self.sh.mailboxes[to]).push(Mail {
                    ptr: b.ptr,
                    bytes: b.bytes,
                    done,
                });
            }
        }
        Ok(())
    }

    /// Frees what other threads sent here, each on a random stream of this thread after
    /// waiting on the block's event there.
    fn receive(&mut self) -> Result<(), String> {
        let mail = std::mem::take(&mut *lock(&self.sh.mailboxes[self.t]));
        for m in mail {
            let on = On::pick(&mut self.rng);
            m.done.wait(self.view(on)).map_err(text)?;
            self.free_on(m.ptr, m.bytes, on)?;
            self.counts.cross_thread_frees += 1;
        }
        Ok(())
    }

    fn run(&mut self, ops: usize) -> Result<(), String> {
        for _ in 0..ops {
            self.receive()?;
            let allocate =
                self.live.len() < MAX_LIVE && (self.live.is_empty() || self.rng.below(100) < 55);
            if allocate {
                self.allocate()?;
            } else {
                self.free_one()?;
            }
        }
        Ok(())
    }

    /// After every thread's operations: frees the mail and every block still held.
    fn finish(&mut self) -> Result<(), String> {
        self.receive()?;
        let mut first = Ok(());
        while let Some(b) = self.live.pop() {
            let r = self
                .check(&b)
                .and_then(|()| self.free_on(b.ptr, b.bytes, b.on));
            if r.is_ok() {
                self.counts.same_stream_frees += 1;
            }
            first = first.and(r);
        }
        for s in &self.own {
            first = first.and(s.view().synchronize().map_err(text));
        }
        first
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// One thread: its operations, the barrier (always reached, so no thread waits forever), then
/// the frees of what is left.
fn thread_body(t: usize, sh: &Shared<'_>, ops: usize) -> Result<Counts, String> {
    let _simulated = sh.env.scope();
    let streams: Result<Vec<Stream>, String> = (0..OWN_STREAMS)
        .map(|i| {
            let n = 100 + (t * OWN_STREAMS + i) as u32;
            sh.env.stream(n, i % 2 == 1).map_err(text)
        })
        .collect();
    let mut w = Worker {
        t,
        sh,
        own: Vec::new(),
        rng: Rng::new(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) << 32) ^ t as u64),
        live: Vec::new(),
        counts: Counts::default(),
        host: Vec::new(),
        serial: 0,
    };
    let ran = match streams {
        Ok(own) => {
            w.own = own;
            catch_unwind(AssertUnwindSafe(|| w.run(ops))).unwrap_or_else(|p| Err(panic_text(&*p)))
        }
        Err(e) => Err(format!("cannot create streams: {e}")),
    };
    sh.barrier.wait();
    let finished =
        catch_unwind(AssertUnwindSafe(|| w.finish())).unwrap_or_else(|p| Err(panic_text(&*p)));
    ran.and(finished)
        .map(|()| w.counts)
        .map_err(|e| format!("thread {t}: {e}"))
}

/// Runs the stress on `mr` and returns the totals and the seconds it took; `max_bytes` is the
/// largest request, `allow_oom` whether out-of-memory is an accepted answer. On the host the
/// calling thread must have the simulated driver on.
fn stress(
    env: Env,
    mr: &dyn DeviceMemoryResource,
    max_bytes: usize,
    allow_oom: bool,
) -> Result<(Counts, f64), Failed> {
    let ops = env.ops()?;
    let streams = (0..SHARED_STREAMS)
        .map(|i| env.stream(1 + i as u32, i % 2 == 1))
        .collect::<Result<Vec<_>, _>>()?;
    let sh = Shared {
        env,
        mr,
        allow_oom,
        max_bytes,
        live: Mutex::new(BTreeMap::new()),
        mailboxes: (0..THREADS).map(|_| Mutex::new(Vec::new())).collect(),
        barrier: Barrier::new(THREADS),
        streams: &streams,
    };
    let start = Instant::now();
    let results: Vec<Result<Counts, String>> = std::thread::scope(|sc| {
        let sh = &sh;
        let handles: Vec<_> = (0..THREADS)
            .map(|t| sc.spawn(move || thread_body(t, sh, ops)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|p| Err(format!("a thread panicked: {}", panic_text(&*p))))
            })
            .collect()
    });
    rmm_sys::device_synchronize()?;
    let seconds = start.elapsed().as_secs_f64();
    let mut total = Counts::default();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(c) => total.add(&c),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("\n").into());
    }
    let left = lock(&sh.live).len();
    ensure(left == 0, format!("{left} allocations were never freed"))?;
    ensure(
        total.frees() == total.allocations,
        format!(
            "{} allocations but {} frees",
            total.allocations,
            total.frees()
        ),
    )?;
    for (i, m) in sh.mailboxes.iter().enumerate() {
        ensure(
            lock(m).is_empty(),
            format!("thread {i}'s mailbox is not empty"),
        )?;
    }
    Ok((total, seconds))
}

/// The summary line of a trial.
fn report(env: Env, name: &str, c: &Counts, seconds: f64, extra: &str) {
    // On the host nothing is queued: the last write is done before the free.
    let (prefix, pending) = match env {
        Env::Gpu => ("stress", "with work pending"),
        Env::Host => ("stress (host)", "right after a write"),
    };
    println!(
        "{prefix}: {name}: {} ops ({} allocations, {} refused, {} frees: {} same-stream, {} \
         cross-stream, {} cross-thread, {} {pending}), {} bytes allocated, {} bytes \
         verified, {THREADS} threads, {seconds:.1} s{extra}",
        c.ops(),
        c.allocations,
        c.refused,
        c.frees(),
        c.same_stream_frees,
        c.cross_stream_frees,
        c.cross_thread_frees,
        c.pending_frees,
        c.bytes_allocated,
        c.bytes_verified,
    );
}

/// A subject: builds its resource in `env`, runs the stress and checks what it left.
type Subject = fn(Env, &str) -> Result<(), Failed>;

/// A GPU trial (`stress/NAME`), one at a time (some subjects take large shares of the device).
fn gpu_trial(name: &str, unmet: fn() -> Option<String>, f: Subject) -> Trial {
    let name = name.to_owned();
    testing::gpu_if(format!("stress/{name}"), unmet, move || {
        let _serial = one_at_a_time();
        f(Env::Gpu, &name)
    })
}

/// The same subject on the host (`stress_host/NAME`): runs everywhere, CI included.
fn host_trial(name: &str, f: Subject) -> Trial {
    let name = name.to_owned();
    Trial::test(format!("stress_host/{name}"), move || {
        let _serial = one_at_a_time();
        let _simulated = Env::Host.scope();
        f(Env::Host, &name)
    })
}

fn no_need() -> Option<String> {
    None
}

// ----- the subjects -----

fn cuda(env: Env, name: &str) -> Result<(), Failed> {
    let mr = CudaMemoryResource::new();
    let (c, secs) = stress(env, &mr, 4 * MIB, false)?;
    report(env, name, &c, secs, "");
    Ok(())
}

fn cuda_async(env: Env, name: &str) -> Result<(), Failed> {
    let mr = CudaAsyncMemoryResource::new()?;
    let (c, secs) = stress(env, &mr, 4 * MIB, false)?;
    let st = mr.statistics()?;
    ensure(
        st.used_current == 0,
        format!(
            "the driver pool has {} bytes in use after every free",
            st.used_current
        ),
    )?;
    report(
        env,
        name,
        &c,
        secs,
        &format!(", pool high-water mark {} bytes", st.used_high),
    );
    Ok(())
}

fn pool(env: Env, name: &str) -> Result<(), Failed> {
    let mr = PoolMemoryResource::new(env.upstream(), 0)?;
    let (c, secs) = stress(env, &mr, env.max_bytes(4 * MIB), false)?;
    ensure(
        mr.outstanding_allocations() == 0,
        format!("{} allocations outstanding", mr.outstanding_allocations()),
    )?;
    report(
        env,
        name,
        &c,
        secs,
        &format!(", pool size {} bytes", mr.pool_size()),
    );
    Ok(())
}

fn arena(env: Env, name: &str) -> Result<(), Failed> {
    let size = match env {
        Env::Gpu => (2 * GIB).min(rmm_sys::percent_of_free_device_memory(50)?),
        Env::Host => 64 * MIB,
    };
    let mr =
        ArenaMemoryResource::with_options(env.upstream(), ArenaOptions::new().arena_size(size))?;
    let (c, secs) = stress(env, &mr, env.max_bytes(4 * MIB), false)?;
    // Everything was freed: the whole arena is one free range again.
    let whole = mr.allocate_sync(mr.arena_size(), 256).map_err(|e| {
        format!(
            "after the stress the whole arena ({} bytes) cannot be allocated: {e}",
            mr.arena_size()
        )
    })?;
    // SAFETY: `whole` came from `mr` with this size.
    unsafe { mr.deallocate_sync(whole, mr.arena_size(), 256)? };
    report(
        env,
        name,
        &c,
        secs,
        &format!(", arena {} bytes", mr.arena_size()),
    );
    Ok(())
}

fn binning(env: Env, name: &str) -> Result<(), Failed> {
    // Fixed-size bins of 256 KiB to 4 MiB; smaller requests go to the 256 KiB bin, larger
    // ones (up to 8 MiB on the GPU) to the upstream. On the host, bins of 16 KiB to 128 KiB,
    // so that requests of up to 256 KiB reach the upstream too.
    let (min, max) = match env {
        Env::Gpu => (18, 22),
        Env::Host => (14, 17),
    };
    let mr = BinningMemoryResource::with_options(
        env.upstream(),
        BinningOptions::new()
            .min_size_exponent(min)
            .max_size_exponent(max),
    )?;
    let (c, secs) = stress(env, &mr, env.max_bytes(8 * MIB), false)?;
    report(env, name, &c, secs, "");
    Ok(())
}

fn fixed_size(env: Env, name: &str) -> Result<(), Failed> {
    let block = env.max_bytes(MIB);
    let mr = FixedSizeMemoryResource::with_options(
        env.upstream(),
        FixedSizeOptions::new()
            .block_size(block)
            .blocks_to_preallocate(16),
    )?;
    let (c, secs) = stress(env, &mr, block, false)?;
    ensure(
        mr.outstanding_allocations() == 0,
        format!("{} allocations outstanding", mr.outstanding_allocations()),
    )?;
    report(
        env,
        name,
        &c,
        secs,
        &format!(", pool size {} bytes", mr.pool_size()),
    );
    Ok(())
}

/// Statistics over limiting over a pool. The limit is within the stress's reach (512 MiB on
/// the GPU, 12 MiB on the host), so requests near it are refused with out-of-memory (counted
/// as refused); the counters must still balance exactly.
fn statistics_limiting_pool(env: Env, name: &str) -> Result<(), Failed> {
    let limit = match env {
        Env::Gpu => 512 * MIB,
        Env::Host => 12 * MIB,
    };
    let pool = PoolMemoryResource::new(env.upstream(), 0)?;
    let limiting = LimitingResourceAdaptor::new(pool.clone(), limit);
    let mr = StatisticsResourceAdaptor::new(limiting.clone());
    let (c, secs) = stress(env, &mr, env.max_bytes(4 * MIB), true)?;
    let (bytes, allocations) = mr.counters();
    ensure(
        bytes.value == 0 && allocations.value == 0,
        format!(
            "statistics after every free: {} bytes in {} allocations",
            bytes.value, allocations.value
        ),
    )?;
    ensure(
        allocations.total == c.allocations as i64 && bytes.total == c.bytes_allocated as i64,
        format!(
            "statistics totals {} allocations / {} bytes, the threads made {} / {}",
            allocations.total, bytes.total, c.allocations, c.bytes_allocated
        ),
    )?;
    ensure(
        limiting.allocated_bytes() == 0,
        format!(
            "the limiting adaptor counts {} bytes after every free",
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
    ensure(
        c.allocations >= c.refused,
        format!(
            "the limit refused most requests ({} of {}): the stress did not stress the pool",
            c.refused,
            c.allocations + c.refused
        ),
    )?;
    report(
        env,
        name,
        &c,
        secs,
        &format!(
            ", limit {limit} bytes, peak {} bytes in {} allocations",
            bytes.peak, allocations.peak
        ),
    );
    Ok(())
}

/// The checks can fail: an overlapping range is refused and a changed byte is found (on the
/// host, through the same code the stress uses).
fn harness_detects_overlaps_and_corruption() -> Result<(), Failed> {
    let _simulated = Env::Host.scope();
    let mr = HostMockResource::new();
    let streams = (0..SHARED_STREAMS)
        .map(|i| Env::Host.stream(1 + i as u32, false))
        .collect::<Result<Vec<_>, _>>()?;
    let sh = Shared {
        env: Env::Host,
        mr: &mr,
        allow_oom: false,
        max_bytes: 64 * KIB,
        live: Mutex::new(BTreeMap::new()),
        mailboxes: vec![Mutex::new(Vec::new())],
        barrier: Barrier::new(1),
        streams: &streams,
    };
    let at = |a: u64| DevicePtr::from_raw(a);
    sh.claim(at(0x10000), 0x200)?;
    ensure(
        sh.claim(at(0x10100), 16).is_err(),
        "a range inside a live one was accepted",
    )?;
    ensure(
        sh.claim(at(0xff00), 0x101).is_err(),
        "a range over the start of a live one was accepted",
    )?;
    ensure(
        sh.claim(at(0xfe00), 0x1000).is_err(),
        "a range around a live one was accepted",
    )?;
    sh.claim(at(0x10200), 16)?;
    sh.claim(at(0xff00), 0x100)?;
    for a in [0x10000, 0x10200, 0xff00] {
        sh.release(at(a))?;
    }
    ensure(
        sh.release(at(0x10000)).is_err(),
        "a second release was accepted",
    )?;

    let mut w = Worker {
        t: 0,
        sh: &sh,
        own: Vec::new(),
        rng: Rng::new(7),
        live: Vec::new(),
        counts: Counts::default(),
        host: Vec::new(),
        serial: 0,
    };
    while w.live.is_empty() {
        w.allocate()?;
    }
    let b = w.live.pop().ok_or("no block")?;
    w.check(&b)?;
    let mut caught = Vec::new();
    for offset in [0, b.bytes / 2, b.bytes - 1] {
        let byte = b.ptr.as_host_ptr::<u8>();
        // SAFETY: `b` is a live host-memory block of `b.bytes` bytes that only this thread uses.
        unsafe {
            *byte.add(offset) ^= 0x40;
        }
        caught.push(w.check(&b).is_err());
        // SAFETY: as above.
        unsafe {
            *byte.add(offset) ^= 0x40;
        }
    }
    w.check(&b)?;
    w.free_on(b.ptr, b.bytes, b.on)?;
    ensure(
        caught.iter().all(|&c| c),
        format!("a changed byte went unnoticed (first, middle, last: {caught:?})"),
    )?;
    ensure(mr.live_allocations() == 0, "the block was not freed")
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let sub_allocators: [(&str, Subject); 5] = [
        ("pool", pool),
        ("arena", arena),
        ("binning", binning),
        ("fixed_size", fixed_size),
        ("statistics_limiting_pool", statistics_limiting_pool),
    ];
    let mut trials = vec![
        gpu_trial("cuda", no_need, cuda),
        gpu_trial("cuda_async", no_pools, cuda_async),
    ];
    for (name, f) in sub_allocators {
        trials.push(gpu_trial(name, no_need, f));
    }
    for (name, f) in sub_allocators {
        trials.push(host_trial(name, f));
    }
    trials.push(Trial::test(
        "stress_host/harness_detects_overlaps_and_corruption",
        harness_detects_overlaps_and_corruption,
    ));
    libtest_mimic::run(&args, trials).exit();
}
