//! What each adaptor adds to an allocate + deallocate pair.
//!
//! The upstream is a do-nothing resource ([`NullUpstream`]): it hands out fake addresses from a
//! per-thread counter and frees nothing, so the time measured is the adaptor's own work (the
//! host mock's mutex and system allocator would drown it). Compare each `pair/<adaptor>` with
//! `pair/bare`. The `threads/` group runs the same pairs on 1 and 2 threads at once: the time
//! per iteration is the wall time for every thread to do that many pairs, so equal times mean
//! perfect scaling (throughput doubled) and twice the time means no gain from the second
//! thread. Compare with `threads/bare/{1,2}`, which shows how far the machine itself scaled
//! during the run (other load on a small machine takes the second core away).

use std::any::Any;
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_main, Criterion};
use rmm_mr::{
    AlignedResourceAdaptor, DeviceMemoryResource, FailureCallbackResourceAdaptor,
    LimitingResourceAdaptor, LoggingOptions, LoggingResourceAdaptor, MrResult,
    StatisticsResourceAdaptor, ThreadSafeResourceAdaptor, TrackingResourceAdaptor,
};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

/// Slots per thread before fake addresses repeat (a pool reuses addresses too).
const SLOTS: u64 = 4096;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's address range and position in it.
    static CURSOR: (u64, Cell<u64>) = (NEXT_THREAD.fetch_add(1, Ordering::Relaxed) << 40, Cell::new(0));
}

/// A resource that does no work: 256-aligned fake addresses, never dereferenced, from a
/// per-thread counter (no shared state, so threads never contend in it); `deallocate` is a
/// no-op.
#[derive(Debug, Default)]
struct NullUpstream;

// SAFETY: a benchmark double handing out fake addresses. That breaks the promise of valid
// memory, which is sound only because this benchmark never touches the memory.
unsafe impl DeviceMemoryResource for NullUpstream {
    #[inline]
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        Ok(CURSOR.with(|(base, n)| {
            let i = n.get();
            n.set((i + 1) % SLOTS);
            DevicePtr::from_raw(base + i * 256)
        }))
    }

    #[inline]
    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        _ptr: DevicePtr,
        _bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        Ok(())
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        other.as_any().is::<Self>()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One allocate + deallocate pair of 256 bytes.
#[inline]
fn pair<R: DeviceMemoryResource>(mr: &R) {
    let s = CudaStreamView::default();
    let bytes = black_box(256);
    let p = mr.allocate(s, bytes, 256).unwrap();
    // SAFETY: `p` came from `mr` with these arguments (and is a fake address nobody touches).
    unsafe { mr.deallocate(s, black_box(p), bytes, 256).unwrap() };
}

/// Runs `iters` pairs on each of `threads` threads released together; returns the wall time.
fn timed_on_threads<R: DeviceMemoryResource>(mr: &R, threads: usize, iters: u64) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let barrier = &barrier;
            scope.spawn(move || {
                barrier.wait();
                for _ in 0..iters {
                    pair(mr);
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("pair");
    group.bench_function("bare", |b| {
        let mr = NullUpstream;
        b.iter(|| pair(&mr))
    });
    group.bench_function("limiting", |b| {
        let mr = LimitingResourceAdaptor::new(NullUpstream, usize::MAX / 2);
        b.iter(|| pair(&mr))
    });
    group.bench_function("statistics", |b| {
        let mr = StatisticsResourceAdaptor::new(NullUpstream);
        b.iter(|| pair(&mr))
    });
    group.bench_function("tracking", |b| {
        let mr = TrackingResourceAdaptor::new(NullUpstream);
        b.iter(|| pair(&mr))
    });
    group.bench_function("logging_to_sink", |b| {
        let mr = LoggingResourceAdaptor::with_options(
            NullUpstream,
            LoggingOptions::new().writer(std::io::sink()),
        )
        .unwrap();
        b.iter(|| pair(&mr))
    });
    group.bench_function("thread_safe", |b| {
        let mr = ThreadSafeResourceAdaptor::new(NullUpstream);
        b.iter(|| pair(&mr))
    });
    group.bench_function("failure_callback", |b| {
        let mr = FailureCallbackResourceAdaptor::new(NullUpstream, |_| false);
        b.iter(|| pair(&mr))
    });
    group.bench_function("aligned_passthrough", |b| {
        let mr = AlignedResourceAdaptor::new(NullUpstream, 256).unwrap();
        b.iter(|| pair(&mr))
    });
    group.finish();
}

fn threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("threads");
    for n in [1usize, 2] {
        group.bench_function(format!("bare/{n}"), |b| {
            let mr = NullUpstream;
            b.iter_custom(|iters| timed_on_threads(&mr, n, iters))
        });
        group.bench_function(format!("statistics/{n}"), |b| {
            let mr = StatisticsResourceAdaptor::new(NullUpstream);
            b.iter_custom(|iters| timed_on_threads(&mr, n, iters))
        });
        group.bench_function(format!("tracking/{n}"), |b| {
            let mr = TrackingResourceAdaptor::new(NullUpstream);
            b.iter_custom(|iters| timed_on_threads(&mr, n, iters))
        });
        group.bench_function(format!("limiting/{n}"), |b| {
            let mr = LimitingResourceAdaptor::new(NullUpstream, usize::MAX / 2);
            b.iter_custom(|iters| timed_on_threads(&mr, n, iters))
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

#[allow(missing_docs)] // criterion_group! generates an undocumented `pub fn benches`.
mod generated {
    use super::{config, single_thread, threads};
    criterion::criterion_group! {
        name = benches;
        config = config();
        targets = single_thread, threads
    }
}
criterion_main!(generated::benches);
