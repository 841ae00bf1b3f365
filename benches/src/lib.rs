//! Building blocks of the GPU benchmarks: allocation traces (ours and RMM's
//! `random_allocations` sequence), their replay through any [`DeviceMemoryResource`] on several
//! threads (one stream each), medians, tables, sizing from the device's memory, and the peer
//! comparison with RMM C++ ([`peer`]).
//!
//! The benchmark binaries are `benches/*.rs` (one per RMM benchmark, plus `gpu_alloc.rs`) and
//! the peer driver `examples/peer.rs`; `cargo xtask gpu bundle` builds them and `run.sh bench`
//! / `run.sh peer` run them on the GPU machine. See `docs/performance.md`.

pub mod ab;
pub mod args;
pub mod capacity;
pub mod frag;
pub mod gpu;
pub mod latency;
pub mod naive;
pub mod peer;
pub mod peer_ab;
pub mod peer_latency;
pub mod peer_replay;
pub mod peer_rounds;
#[cfg(feature = "driver-hooks")]
pub mod reserve;
pub mod sizing;
pub mod table;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use rmm_mr::{DeviceMemoryResource, MrResult};
use rmm_stream::CudaStream;
use rmm_sys::DevicePtr;

pub use rmm_mr::testing::trace::Op;
pub use rmm_mr::testing::Rng;

/// A trace: `ops` operations, every allocation later freed (the final frees are part of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The operations in order.
    pub ops: Vec<Op>,
    /// Number of slots used.
    pub slots: usize,
}

impl Trace {
    /// [`rmm_mr::testing::trace::random`]: about `live` allocations of `[min_size, max_size]`
    /// bytes outstanding, `ops` operations with the final frees.
    #[must_use]
    pub fn random(ops: usize, min_size: usize, max_size: usize, live: usize, seed: u64) -> Self {
        let (ops, slots) = rmm_mr::testing::trace::random(ops, min_size, max_size, live, seed);
        Self { ops, slots }
    }

    /// [`rmm_mr::testing::trace::rmm_random`]: RMM's `random_allocations` sequence, generated
    /// ahead of time so that every resource, and RMM C++ in the peer comparison, replays the
    /// same operations (its differences from RMM's are documented there).
    #[must_use]
    pub fn rmm_random(
        num_allocations: usize,
        max_size: usize,
        max_usage: usize,
        seed: u64,
    ) -> Self {
        let (ops, slots) =
            rmm_mr::testing::trace::rmm_random(num_allocations, max_size, max_usage, seed);
        Self { ops, slots }
    }

    /// The trace as a memory-event log in RMM's CSV format (what `LoggingResourceAdaptor`
    /// writes): `threads` threads, each doing its own copy of the trace on its own stream,
    /// interleaved operation by operation, with made-up addresses (distinct per thread and
    /// slot) and times. The replay benchmark replays it like a recorded log.
    #[must_use]
    pub fn to_rmm_log(&self, threads: usize) -> String {
        use std::fmt::Write as _;
        let mut out = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
        let mut sizes = vec![vec![0usize; self.slots]; threads];
        let mut row = 0u64;
        for op in &self.ops {
            for (t, sizes) in sizes.iter_mut().enumerate() {
                row += 1;
                let (action, slot, size) = match *op {
                    Op::Alloc { slot, size } => {
                        sizes[slot as usize] = size;
                        ("allocate", slot, size)
                    }
                    Op::Free { slot } => ("free", slot, sizes[slot as usize]),
                };
                // 1 TiB apart per thread, 128 MiB per slot: never two live blocks at one address.
                let addr = 0x7f00_0000_0000u64 + ((t as u64) << 40) + (u64::from(slot) << 27);
                let _ = writeln!(
                    out,
                    "{},00:{:02}:{:02}.{:06},{action},{addr:#x},{size},{:#x}",
                    t + 1,
                    (row / 60_000_000) % 60,
                    (row / 1_000_000) % 60,
                    row % 1_000_000,
                    0x1000 + t
                );
            }
        }
        out
    }

    /// The number of allocations in the trace.
    #[must_use]
    pub fn allocations(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op, Op::Alloc { .. }))
            .count()
    }

    /// The largest single allocation.
    #[must_use]
    pub fn largest(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match *op {
                Op::Alloc { size, .. } => size,
                Op::Free { .. } => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// The largest number of allocations outstanding at once.
    #[must_use]
    pub fn peak_count(&self) -> usize {
        let (mut cur, mut peak) = (0usize, 0usize);
        for op in &self.ops {
            match op {
                Op::Alloc { .. } => {
                    cur += 1;
                    peak = peak.max(cur);
                }
                Op::Free { .. } => cur -= 1,
            }
        }
        peak
    }

    /// The largest number of bytes outstanding at once.
    #[must_use]
    pub fn peak_bytes(&self) -> usize {
        let mut sizes = vec![0usize; self.slots];
        let (mut cur, mut peak) = (0usize, 0usize);
        for op in &self.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    sizes[slot as usize] = size;
                    cur += size;
                    peak = peak.max(cur);
                }
                Op::Free { slot } => cur -= sizes[slot as usize],
            }
        }
        peak
    }
}

/// Replays `trace` through `mr` on `stream` and synchronizes it at the end.
pub fn replay(
    mr: &dyn DeviceMemoryResource,
    stream: &CudaStream,
    trace: &Trace,
) -> MrResult<Duration> {
    let view = stream.view();
    let mut held = vec![(DevicePtr::NULL, 0usize); trace.slots];
    let start = Instant::now();
    for (i, op) in trace.ops.iter().enumerate() {
        let step = match *op {
            Op::Alloc { slot, size } => mr.allocate(view, size, 256).map(|p| {
                held[slot as usize] = (p, size);
            }),
            Op::Free { slot } => {
                let (p, size) = std::mem::replace(&mut held[slot as usize], (DevicePtr::NULL, 0));
                // SAFETY: `p` came from `mr` with `size` on this stream, freed once (the slot
                // is emptied above).
                unsafe { mr.deallocate(view, p, size, 256) }
            }
        };
        if let Err(e) = step {
            // Give back what this replay holds, so a failed row leaves the resource as it found it.
            for (p, size) in held.into_iter().filter(|(p, _)| !p.is_null()) {
                // SAFETY: each live slot holds a pointer from `mr` with its size, freed once.
                let _ = unsafe { mr.deallocate(view, p, size, 256) };
            }
            let _ = view.synchronize();
            return Err(rmm_mr::MrError::bad_alloc(format!(
                "operation {i} of {} ({op:?}) failed: {e}",
                trace.ops.len()
            )));
        }
    }
    view.synchronize()?;
    Ok(start.elapsed())
}

/// Creates one non-blocking stream per replay thread on the current device.
pub fn streams(threads: usize) -> MrResult<Vec<CudaStream>> {
    (0..threads)
        .map(|_| Ok(CudaStream::non_blocking()?))
        .collect()
}

/// Replays a copy of `trace` on each of `streams.len()` threads, thread `i` on `streams[i]`,
/// started together; returns the wall time of the slowest. The same streams serve warm-up and
/// timed passes, as a long-running program keeps its streams.
pub fn replay_threads(
    mr: &dyn DeviceMemoryResource,
    trace: &Trace,
    streams: &[CudaStream],
) -> MrResult<Duration> {
    replay_threads_counted(mr, trace, streams).map(|(wall, _)| wall)
}

/// [`replay_threads`], and the driver calls the replaying threads made meanwhile, all threads
/// together ([`DriverCalls`]; each thread's final stream synchronization included).
pub fn replay_threads_counted(
    mr: &dyn DeviceMemoryResource,
    trace: &Trace,
    streams: &[CudaStream],
) -> MrResult<(Duration, DriverCalls)> {
    let device = rmm_sys::current_device()?;
    let barrier = Barrier::new(streams.len() + 1);
    let results: Vec<MrResult<(Duration, DriverCalls)>> = std::thread::scope(|s| {
        let joins: Vec<_> = streams
            .iter()
            .map(|stream| {
                let barrier = &barrier;
                s.spawn(move || -> MrResult<(Duration, DriverCalls)> {
                    rmm_sys::set_current_device(device)?;
                    barrier.wait();
                    let calls = DriverCalls::now();
                    let start = Instant::now();
                    replay(mr, stream, trace)?;
                    Ok((start.elapsed(), DriverCalls::now().since(calls)))
                })
            })
            .collect();
        barrier.wait();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(rmm_mr::MrError::bad_alloc("thread panicked")))
            })
            .collect()
    });
    let mut worst = Duration::ZERO;
    let mut calls = DriverCalls::default();
    for r in results {
        let (wall, made) = r?;
        worst = worst.max(wall);
        calls = calls.plus(made);
    }
    Ok((worst, calls))
}

/// Counts of the driver calls that make a stream-ordered pool's slow paths cost (rmm-sys's
/// per-thread call counters, on in the benchmarks' build): events recorded so that another
/// stream may take a free block, waits of one stream on another's event, and synchronizations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// `cuEventRecord`.
    pub event_records: u64,
    /// `cuStreamWaitEvent`.
    pub stream_waits: u64,
    /// `cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`.
    pub synchronizations: u64,
}

impl DriverCalls {
    /// The calling thread's counts so far (feature `driver-hooks`, the default; without it
    /// rmm-sys counts nothing and these are 0).
    #[cfg(feature = "driver-hooks")]
    #[must_use]
    pub fn now() -> Self {
        use rmm_sys::fault::{calls, DriverCall};
        Self {
            event_records: calls(DriverCall::EventRecord),
            stream_waits: calls(DriverCall::StreamWait),
            synchronizations: calls(DriverCall::Synchronize),
        }
    }

    /// All 0: built without the feature `driver-hooks`, rmm-sys counts nothing.
    #[cfg(not(feature = "driver-hooks"))]
    #[must_use]
    pub fn now() -> Self {
        Self::default()
    }

    /// The calls made since `before` (a snapshot of the same thread).
    #[must_use]
    pub fn since(self, before: Self) -> Self {
        Self {
            event_records: self.event_records.wrapping_sub(before.event_records),
            stream_waits: self.stream_waits.wrapping_sub(before.stream_waits),
            synchronizations: self.synchronizations.wrapping_sub(before.synchronizations),
        }
    }

    /// Both counts together.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            event_records: self.event_records + other.event_records,
            stream_waits: self.stream_waits + other.stream_waits,
            synchronizations: self.synchronizations + other.synchronizations,
        }
    }
}

/// What a benchmark body returns.
pub type BenchResult = Result<(), Box<dyn std::error::Error>>;

/// Runs a benchmark binary's body: without a GPU it prints one line and exits successfully (a
/// benchmark, not a test); otherwise it prints the device, runs `body`, prints the elapsed
/// time and exits with status 1 when `body` failed.
pub fn bench_main(name: &str, body: impl FnOnce(&args::Args) -> BenchResult) {
    let args = args::Args::from_env();
    if let Some(why) = rmm_sys::gpu_unavailable_reason() {
        println!("{name}: skipped ({why})");
        return;
    }
    let start = Instant::now();
    let result = gpu::describe_device()
        .map_err(Into::into)
        .and_then(|device| {
            println!("# rmm-rs {name}\n\ndevice: {device}");
            body(&args)
        });
    println!("\n{name}: {:.1} s", start.elapsed().as_secs_f64());
    if let Err(e) = result {
        eprintln!("{name} failed: {e}");
        std::process::exit(1);
    }
}

/// The median of `samples` (which it sorts).
#[must_use]
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_balanced_and_bounded() {
        let t = Trace::random(10_000, 1, 4 << 20, 100, 7);
        assert_eq!(t.ops.len(), 10_000);
        let mut live = std::collections::HashSet::new();
        let mut max_live = 0;
        for op in &t.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    assert!((1..=4 << 20).contains(&size));
                    assert!(live.insert(slot), "slot reused while live");
                }
                Op::Free { slot } => assert!(live.remove(&slot), "free of an empty slot"),
            }
            max_live = max_live.max(live.len());
        }
        assert!(live.is_empty(), "trace leaves allocations behind");
        assert!((100..=101).contains(&max_live), "max live {max_live}");
        assert!(t.peak_bytes() <= 101 * (4 << 20));
    }

    /// Replays a trace's bookkeeping: (peak live bytes, max live count, allocations), and
    /// checks that every free frees a live slot and nothing is left.
    fn check(t: &Trace) -> (usize, usize, usize) {
        let mut live = std::collections::HashMap::new();
        let (mut bytes, mut peak, mut max_live, mut allocs) = (0usize, 0usize, 0usize, 0usize);
        for op in &t.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    assert!((slot as usize) < t.slots);
                    assert!(live.insert(slot, size).is_none(), "slot reused while live");
                    bytes += size;
                    allocs += 1;
                }
                Op::Free { slot } => bytes -= live.remove(&slot).expect("free of an empty slot"),
            }
            peak = peak.max(bytes);
            max_live = max_live.max(live.len());
        }
        assert!(live.is_empty(), "trace leaves allocations behind");
        (peak, max_live, allocs)
    }

    #[test]
    fn rmm_random_follows_rmms_rules() {
        const MIB: usize = 1 << 20;
        let t = Trace::rmm_random(1000, 4 * MIB, 16_000 * MIB, 3);
        assert!(matches!(t.ops[0], Op::Alloc { .. }));
        let (peak, _, allocs) = check(&t);
        assert_eq!(allocs, t.allocations());
        // 2N steps plus the final frees; the 73 % rule makes N allocations within 2N steps
        // very likely, and never more.
        assert_eq!(t.ops.len(), 2000 + (allocs - (2000 - allocs)));
        assert!(allocs <= 1000 && allocs > 900, "{allocs}");
        assert!(peak < 16_000 * MIB);
        assert!(t.largest() <= 4 * MIB);
        assert_eq!(t, Trace::rmm_random(1000, 4 * MIB, 16_000 * MIB, 3));
        assert_ne!(t, Trace::rmm_random(1000, 4 * MIB, 16_000 * MIB, 4));

        // A tight budget: live bytes stay below it, and sizes are clamped to it.
        let t = Trace::rmm_random(10_000, 64 * MIB, 200 * MIB, 5);
        let (peak, max_live, _) = check(&t);
        assert!(peak < 200 * MIB, "{peak}");
        assert!(max_live >= 3, "{max_live}");
        let t = Trace::rmm_random(100, 4096 * MIB, 1000 * MIB, 5);
        assert!(t.largest() <= 1000 * MIB);
        assert!(check(&t).0 <= 1000 * MIB);
        assert!(Trace::rmm_random(0, MIB, MIB, 1).ops.is_empty());
    }

    #[test]
    fn rmm_logs_replay_as_the_trace() {
        let t = Trace::random(500, 1, 64 << 10, 20, 9);
        let log = t.to_rmm_log(3);
        assert!(log.starts_with(
            "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x7f"
        ));
        let w = rmm_replay::load(log.as_bytes()).unwrap();
        assert_eq!(w.steps.len(), 3 * t.ops.len());
        assert_eq!((w.threads.len(), w.streams.len()), (3, 3));
        assert_eq!((w.failures, w.unmatched_frees, w.leaked.len()), (0, 0, 0));
        assert_eq!(w.allocations(), 3 * t.allocations());
        // Interleaved copies: the peak in use is at most three times the trace's own.
        let peak = w.in_use.iter().copied().max().unwrap_or(0);
        assert!(
            peak > t.peak_bytes() as u64 && peak <= 3 * t.peak_bytes() as u64,
            "{peak}"
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}
