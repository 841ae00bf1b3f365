//! Retired lists and lock-free waits of the stream-ordered sub-allocators on a GPU, the
//! `retire/...` trials of `gpu_suballocators`:
//!
//! - `threads_and_streams`: rounds of short-lived threads, each with a stream of its own, use
//!   the resource on that stream and on their per-thread default stream, then exit (the stream
//!   is destroyed with them). A new stream's first allocation retires their lists: the lists
//!   alive stay at the legacy list and the live streams', and the slots at the most alive at
//!   once, however many rounds run.
//! - `thief_holds_no_lock`: the blocks of stream A (a foreign stream, which no thief can pin)
//!   are freed behind a gate (a host function that holds A until the test opens it). A thief on stream B, past the owner's grace period,
//!   must synchronize the device to take one of them; while that synchronization is held up by
//!   the gate, A's owner allocates from its own list, which must complete before the gate is
//!   opened (with the old code the thief held A's list lock while it waited). Ordering is
//!   checked with flags; the gate opens itself after a long deadline only so that a failure
//!   does not hang, and that is reported as the failure.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rmm_mr::__internals::pool::StreamLists;
use rmm_mr::{
    DeviceMemoryResource, FixedSizeMemoryResource, FixedSizeOptions, PoolMemoryResource,
    PoolOptions, SharedResource,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::memory;
use rmm_sys::testing::ensure;

/// Threads per round, and rounds.
const AT_ONCE: usize = 8;
const ROUNDS: usize = 4;
const BYTES: usize = 1 << 20;

/// One short-lived thread: a stream of its own and its per-thread default stream, one block on
/// each (written, then freed on its stream), then exit.
fn short_lived<R: DeviceMemoryResource + Clone + Send + 'static>(
    r: &R,
) -> std::thread::JoinHandle<Result<(), String>> {
    let r = r.clone();
    std::thread::spawn(move || {
        let own = CudaStream::non_blocking().map_err(|e| e.to_string())?;
        for s in [own.view(), CudaStreamView::per_thread()] {
            let p = r.allocate(s, BYTES, 256).map_err(|e| e.to_string())?;
            // SAFETY: `p` is a live allocation of `BYTES` bytes usable on `s`.
            unsafe { memory::memset_d32_async(p, 0x5a5a_5a5a, BYTES / 4, s.as_raw()) }
                .map_err(|e| e.to_string())?;
            // SAFETY: `p` came from `r` on `s`; its only work is ordered on `s`.
            unsafe { r.deallocate(s, p, BYTES, 256) }.map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

/// Rounds of short-lived threads over `r`; `lists(retire)` reads its list counts.
pub fn threads_and_streams<R: DeviceMemoryResource + Clone + Send + 'static>(
    r: &R,
    lists: impl Fn(bool) -> StreamLists,
) -> Result<(), Failed> {
    for round in 0..ROUNDS {
        let handles: Vec<_> = (0..AT_ONCE).map(|_| short_lived(r)).collect();
        for h in handles {
            // Joined through its handle: the thread's thread-local destructors have run.
            h.join().map_err(|_| "a thread panicked")??;
        }
        // A new stream's first allocation retires the lists of the threads and streams gone.
        let fresh = CudaStream::non_blocking()?;
        let p = r.allocate(fresh.view(), BYTES, 256)?;
        // SAFETY: `p` came from `r` on `fresh`, unused.
        unsafe { r.deallocate(fresh.view(), p, BYTES, 256)? };
        let now = lists(false);
        ensure(
            now.alive == 2,
            format!(
                "round {round}: {} lists alive, expected the legacy list and one stream's",
                now.alive
            ),
        )?;
        ensure(
            now.slots <= 2 * AT_ONCE + 1,
            format!(
                "round {round}: {} list slots for at most {} lists alive at once",
                now.slots,
                2 * AT_ONCE + 1
            ),
        )?;
        fresh.synchronize()?;
    }
    let end = lists(true);
    ensure(
        end.alive == 1,
        format!(
            "{} lists alive at the end, expected only the legacy list",
            end.alive
        ),
    )?;
    Ok(())
}

pub fn pool_threads_and_streams(up: SharedResource) -> Result<(), Failed> {
    let pool = PoolMemoryResource::new(up, 0)?;
    threads_and_streams(&pool, |retire| {
        rmm_mr::__internals::pool::stream_lists(&pool, retire)
    })?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")
}

pub fn fixed_size_threads_and_streams(up: SharedResource) -> Result<(), Failed> {
    let fixed = FixedSizeMemoryResource::with_options(
        up,
        FixedSizeOptions::new()
            .block_size(BYTES)
            .blocks_to_preallocate(4),
    )?;
    threads_and_streams(&fixed, |retire| {
        rmm_mr::__internals::fixed_size::stream_lists(&fixed, retire)
    })?;
    ensure(fixed.outstanding_allocations() == 0, "allocations left")
}

/// A gate on a stream: work queued after it waits until [`Gate::open`] (or a long deadline).
#[derive(Default)]
struct GateState {
    open: Mutex<bool>,
    opened: Condvar,
    /// Set when the deadline opened it (a failure the test reports).
    timed_out: AtomicBool,
}

/// How long the gate waits for the test before opening itself (only so a failure cannot hang).
const GATE_DEADLINE: Duration = Duration::from_secs(30);

unsafe extern "C" fn gate_fn(data: *mut c_void) {
    // SAFETY: `data` is the `Arc<GateState>` leaked by `Gate::close`, handed over once.
    let state = unsafe { Arc::from_raw(data.cast::<GateState>()) };
    let deadline = Instant::now() + GATE_DEADLINE;
    let mut open = state.open.lock().unwrap_or_else(|e| e.into_inner());
    while !*open {
        let now = Instant::now();
        if now >= deadline {
            state.timed_out.store(true, Ordering::SeqCst);
            break;
        }
        open = state
            .opened
            .wait_timeout(open, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

struct Gate(Arc<GateState>);

impl Gate {
    /// Closes a gate on `stream`.
    fn close(stream: CudaStreamView<'_>) -> Result<Self, Failed> {
        let state = Arc::new(GateState::default());
        let data = Arc::into_raw(Arc::clone(&state)) as *mut c_void;
        // SAFETY: `gate_fn` runs once with `data`, which it takes back; it makes no CUDA call.
        let r = unsafe { rmm_sys::stream::launch_host_func(stream.as_raw(), gate_fn, data) };
        if let Err(e) = r {
            // SAFETY: the launch failed: the function will never run and take `data` back.
            drop(unsafe { Arc::from_raw(data.cast::<GateState>()) });
            return Err(e.into());
        }
        Ok(Self(state))
    }

    fn open(&self) {
        *self.0.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.opened.notify_all();
    }

    fn is_open(&self) -> bool {
        *self.0.open.lock().unwrap_or_else(|e| e.into_inner()) || self.timed_out()
    }

    fn timed_out(&self) -> bool {
        self.0.timed_out.load(Ordering::SeqCst)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// See the [module documentation](self). A pool of two 8 MiB blocks that may grow by one more.
pub fn thief_holds_no_lock(up: SharedResource) -> Result<(), Failed> {
    const BLOCK: usize = 8 << 20;
    let pool = PoolMemoryResource::with_options(
        up,
        PoolOptions::new(2 * BLOCK).maximum_pool_size(3 * BLOCK),
    )?;
    // A is a foreign stream (made with the raw driver call): a thief cannot pin it to record
    // on it, so it asks, and synchronizes once the owner's grace period is over.
    let a_raw = rmm_sys::stream::stream_create(rmm_sys::stream::CU_STREAM_NON_BLOCKING)?;
    let result = {
        // SAFETY: `a_raw` lives until it is destroyed below, after every use of this view.
        let a = unsafe { CudaStreamView::from_raw(a_raw) };
        thief_holds_no_lock_on::<BLOCK>(&pool, a)
    };
    // SAFETY: created above, destroyed once; the view is gone.
    let destroyed = unsafe { rmm_sys::stream::stream_destroy(a_raw) };
    result?;
    destroyed?;
    ensure(pool.outstanding_allocations() == 0, "allocations left")
}

/// [`thief_holds_no_lock`] with A's stream given; blocks of `BLOCK` bytes.
fn thief_holds_no_lock_on<const BLOCK: usize>(
    pool: &PoolMemoryResource,
    a: CudaStreamView<'_>,
) -> Result<(), Failed> {
    let b = CudaStream::non_blocking()?;
    let b = b.view();
    // A takes the initial chunk in two blocks and frees them behind the gate.
    let x = pool.allocate(a, BLOCK, 256)?;
    let y = pool.allocate(a, BLOCK, 256)?;
    let gate = Gate::close(a)?;
    // SAFETY: `x` and `y` came from `pool` on `a`, unused.
    unsafe {
        pool.deallocate(a, x, BLOCK, 256)?;
        pool.deallocate(a, y, BLOCK, 256)?;
    }
    // B's first allocation asks A to record (A stays idle) and grows by its request.
    let z = pool.allocate(b, BLOCK, 256)?;
    ensure(
        z != x && z != y && pool.pool_size() == 3 * BLOCK,
        format!(
            "B's first block {z} should be a new chunk (pool size {})",
            pool.pool_size()
        ),
    )?;
    // Past the owner's grace period: B's next allocation must synchronize the device.
    std::thread::sleep(Duration::from_millis(20));
    let thief_done = AtomicBool::new(false);
    let result = std::thread::scope(|sc| -> Result<(), Failed> {
        let thief = sc.spawn(|| {
            let r = pool.allocate(b, BLOCK, 256);
            thief_done.store(true, Ordering::SeqCst);
            r
        });
        // Give the thief time to reach its synchronization (if it has not, this trial proves
        // less, but cannot fail wrongly: the owner's allocation never needs the thief).
        std::thread::sleep(Duration::from_millis(300));
        let owner = pool.allocate(a, BLOCK, 256);
        let (thief_was_done, gate_was_open) = (thief_done.load(Ordering::SeqCst), gate.is_open());
        gate.open();
        let stolen = thief.join().map_err(|_| "the thief panicked")?;
        let owner = owner?;
        let stolen = stolen?;
        let order = if gate.timed_out() || gate_was_open {
            Err(Failed::from(
                "the owner's same-stream allocation completed only after the gate opened: the \
                 thief held a lock while it waited",
            ))
        } else {
            if thief_was_done {
                // The thief reached the list after the owner's allocation recorded A's event and
                // waited on it on the device instead: nothing was shown either way.
                eprintln!("note: the thief was not yet waiting when the owner allocated");
            }
            Ok(())
        };
        let blocks = ensure(
            (stolen == x && owner == y) || (stolen == y && owner == x),
            format!("expected A's blocks {x} and {y}, the thief got {stolen}, the owner {owner}"),
        );
        b.synchronize()?;
        a.synchronize()?;
        // SAFETY: each came from `pool` on its stream; both streams were synchronized.
        unsafe {
            pool.deallocate(b, stolen, BLOCK, 256)?;
            pool.deallocate(a, owner, BLOCK, 256)?;
            pool.deallocate(b, z, BLOCK, 256)?;
        }
        order.and(blocks)
    });
    drop(gate);
    a.synchronize()?;
    result
}
