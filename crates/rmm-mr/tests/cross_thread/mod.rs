//! Frees across host threads on the per-thread default stream, the shared part of the
//! `cross_thread_free` GPU trials of the sub-allocators (`gpu_suballocators`, `gpu_arena`).
//!
//! Thread 1 allocates a block on its per-thread default stream and queues work on it behind a
//! stall (a host function that sleeps): a write of pattern A, or a copy of the block's bytes
//! (pattern A, written before the stall) into a buffer of its own. It sends the block to
//! thread 2, which frees it on *its* per-thread default stream, allocates the same size there
//! and writes pattern B into what it got. Thread 1 stays alive until thread 2 has checked, so
//! nothing that happens at thread exit can order the streams.
//!
//! If the resource let thread 2 reuse the block before thread 1's work was done, thread 2's
//! write runs at once, while thread 1's is still stalled: the block ends up holding A instead
//! of B, or thread 1's copy holds B instead of A. The checks compare every word; no timing is
//! asserted (the stall only makes a missing ordering certain to show).

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::mpsc;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};
use rmm_mr::DeviceMemoryResource;
use rmm_stream::{default_stream_mode, stall, CudaEvent, CudaStreamView, DefaultStreamMode};
use rmm_sys::testing::gpu_if;
use rmm_sys::{memory, DevicePtr};

/// How long thread 1's stream is stalled.
pub const STALL: Duration = Duration::from_millis(200);
/// Thread 1's pattern.
pub const PATTERN_A: u32 = 0xa1a1_a1a1;
/// Thread 2's pattern.
pub const PATTERN_B: u32 = 0xb2b2_b2b2;

/// How both threads name their per-thread default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtStream {
    /// `CudaStreamView::per_thread()`, in either default-stream mode.
    PerThread,
    /// `CudaStreamView::default()`, the per-thread default stream in per-thread mode only.
    Default,
}

impl PtStream {
    pub const ALL: [Self; 2] = [Self::PerThread, Self::Default];

    /// The name in trial names.
    pub fn name(self) -> &'static str {
        match self {
            Self::PerThread => "per_thread",
            Self::Default => "default_stream",
        }
    }

    /// The calling thread's stream.
    pub fn view(self) -> CudaStreamView<'static> {
        match self {
            Self::PerThread => CudaStreamView::per_thread(),
            Self::Default => CudaStreamView::default(),
        }
    }

    /// Why the trial is meaningless in this process's default-stream mode, if it is.
    pub fn unavailable(self) -> Option<String> {
        match (self, default_stream_mode()) {
            (Self::Default, DefaultStreamMode::Legacy) => Some(
                "the default stream is the legacy stream in legacy mode (RMM_DEFAULT_STREAM=\
                 legacy): one stream for every thread, no cross-thread hazard"
                    .into(),
            ),
            _ => None,
        }
    }
}

/// A trial on `stream` (a name of the per-thread default stream): ignored, with the reason,
/// without a GPU or in the default-stream mode where that name means the legacy stream.
pub fn gpu_pt(
    name: String,
    stream: PtStream,
    f: impl FnOnce() -> Result<(), Failed> + Send + 'static,
) -> Trial {
    gpu_if(name, move || stream.unavailable(), f)
}

/// Thread 1's pending work on the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// A write of pattern A behind the stall: it must land before thread 2's write.
    Write,
    /// A copy of the block (pattern A) into thread 1's own buffer behind the stall: it must
    /// not see thread 2's bytes.
    Read,
}

impl Pending {
    pub const ALL: [Self; 2] = [Self::Write, Self::Read];

    pub fn name(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
        }
    }
}

/// What thread 2 must get back when it allocates the same size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// The very block thread 1 allocated (the resource hands it over, ordered).
    Same,
    /// Anything (the block may still wait for thread 1's work).
    Any,
}

/// Queues `words` 32-bit writes of `value` at `ptr` on `s`.
pub fn memset(
    ptr: DevicePtr,
    value: u32,
    words: usize,
    s: CudaStreamView<'_>,
) -> Result<(), Failed> {
    // SAFETY: the callers pass a live allocation of at least `4 * words` bytes usable on `s`.
    unsafe { memory::memset_d32_async(ptr, value, words, s.as_raw())? };
    Ok(())
}

/// Copies `words` words at `ptr` back on `s` (synchronizing it) and checks they all equal
/// `value`; `what` names the memory in the error.
pub fn expect_words(
    ptr: DevicePtr,
    value: u32,
    words: usize,
    s: CudaStreamView<'_>,
    what: &str,
) -> Result<(), Failed> {
    let mut host = vec![0u8; words * 4];
    // SAFETY: the callers pass a live allocation of at least `4 * words` bytes readable on `s`.
    unsafe { memory::copy_to_host_sync(&mut host, ptr, s.as_raw())? };
    let found = host
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    match found.enumerate().find(|&(_, w)| w != value) {
        None => Ok(()),
        Some((i, w)) => {
            Err(format!("{what}: word {i} of {ptr} is {w:#010x}, expected {value:#010x}").into())
        }
    }
}

/// What thread 1 queued: an event that completes when its work is done, and for
/// [`Pending::Read`] the buffer its copy writes.
struct Launched {
    done: CudaEvent,
    copy: Option<DevicePtr>,
}

/// Thread 1's part: queues `pending` on the block `p` of `bytes` bytes, on `s`.
fn launch(
    p: DevicePtr,
    bytes: usize,
    pending: Pending,
    s: CudaStreamView<'_>,
) -> Result<Launched, Failed> {
    let words = bytes / 4;
    let copy = match pending {
        Pending::Write => {
            stall(s, STALL)?;
            memset(p, PATTERN_A, words, s)?;
            None
        }
        Pending::Read => {
            memset(p, PATTERN_A, words, s)?;
            let copy = memory::mem_alloc(bytes)?;
            stall(s, STALL)?;
            // SAFETY: `p` is live until thread 2 frees it, which the resource orders after
            // this copy (what the trial checks); `copy` is this trial's own allocation.
            unsafe { memory::memcpy_async(copy, p, bytes, s.as_raw())? };
            Some(copy)
        }
    };
    let done = CudaEvent::new()?;
    done.record(s)?;
    Ok(Launched { done, copy })
}

enum FromThread1 {
    Allocated(DevicePtr),
    Launched(Launched),
}

enum ToThread1 {
    /// Queue the pending work now.
    Go,
    /// Thread 2 is done (or gave up): exit.
    Finish,
}

fn message(e: Failed) -> String {
    e.message().unwrap_or("failed").to_owned()
}

/// Runs one cross-thread free trial on `r` with blocks of `bytes` bytes (a multiple of 4).
///
/// `setup` runs on thread 2 after thread 1 allocated its block and before thread 1 queues its
/// work (the arena trials move memory around there); it returns allocations of `r` (made on
/// thread 2's stream) to free at the end. `reuse` says what thread 2's allocation must be.
pub fn run(
    r: &dyn DeviceMemoryResource,
    bytes: usize,
    stream: PtStream,
    pending: Pending,
    reuse: Reuse,
    setup: &(dyn Fn(DevicePtr) -> Result<Vec<(DevicePtr, usize)>, Failed> + Sync),
) -> Result<(), Failed> {
    let words = bytes / 4;
    let (to2, from1) = mpsc::channel::<Result<FromThread1, String>>();
    let (to1, from2) = mpsc::channel::<ToThread1>();
    std::thread::scope(|sc| {
        let thread1 = sc.spawn(move || {
            let s = stream.view();
            let p = match r.allocate(s, bytes, 256) {
                Ok(p) => p,
                Err(e) => {
                    let _ = to2.send(Err(format!("thread 1's allocation: {e}")));
                    return;
                }
            };
            let _ = to2.send(Ok(FromThread1::Allocated(p)));
            if !matches!(from2.recv(), Ok(ToThread1::Go)) {
                return;
            }
            let launched = launch(p, bytes, pending, s).map_err(message);
            let _ = to2.send(launched.map(FromThread1::Launched));
            // Keep this thread (its per-thread stream, its arena) alive until thread 2 is done.
            let _ = from2.recv();
        });
        let result = (|| -> Result<(), Failed> {
            let p = match from1.recv() {
                Ok(Ok(FromThread1::Allocated(p))) => p,
                Ok(Err(e)) => return Err(e.into()),
                _ => return Err("thread 1 did not allocate".into()),
            };
            let extra = setup(p)?;
            to1.send(ToThread1::Go)
                .map_err(|_| Failed::from("thread 1 is gone"))?;
            let launched = match from1.recv() {
                Ok(Ok(FromThread1::Launched(l))) => l,
                Ok(Err(e)) => return Err(e.into()),
                _ => return Err("thread 1 did not queue its work".into()),
            };
            let s = stream.view();
            // SAFETY: `p` came from `r` with `bytes` (on thread 1); thread 2 frees it once, on
            // its own per-thread stream, as a buffer sent between threads is dropped.
            unsafe { r.deallocate(s, p, bytes, 256)? };
            let q = r.allocate(s, bytes, 256)?;
            memset(q, PATTERN_B, words, s)?;
            s.synchronize()?;
            launched.done.synchronize()?;
            let contents = match launched.copy {
                None => expect_words(
                    q,
                    PATTERN_B,
                    words,
                    s,
                    "thread 2 wrote its reallocation before thread 1's pending write to the \
                     block was done",
                ),
                Some(copy) => expect_words(
                    copy,
                    PATTERN_A,
                    words,
                    s,
                    "thread 1's pending read of the block saw thread 2's bytes",
                ),
            };
            let reused = match reuse {
                Reuse::Same if q != p => Err(Failed::from(format!(
                    "thread 2 got {q}, expected the block {p} thread 1 allocated and thread 2 \
                     freed"
                ))),
                _ => Ok(()),
            };
            // SAFETY: `q` came from `r` on `s`, which was synchronized; the extra allocations
            // came from `r` on this thread's stream with these sizes.
            unsafe {
                r.deallocate(s, q, bytes, 256)?;
                for (ptr, n) in extra {
                    r.deallocate(s, ptr, n, 256)?;
                }
            }
            if let Some(copy) = launched.copy {
                // SAFETY: thread 1's buffer, its copy done (`done` was synchronized).
                unsafe { memory::mem_free(copy)? };
            }
            contents.and(reused)
        })();
        let _ = to1.send(ToThread1::Finish);
        let joined = thread1
            .join()
            .map_err(|_| Failed::from("thread 1 panicked"));
        result.and(joined)
    })
}
