//! Cost of the pure adaptor cores per allocation + free pair: statistics counters, tracking
//! registry, and formatting a memory-event CSV row. One and two threads.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_main, Criterion};
use rmm_mr::__internals::statistics::StatisticsCounters;
use rmm_mr::__internals::tracking::TrackingRegistry;
use rmm_mr::{write_event, EventTime, MemoryEvent};

/// Runs `work(thread, iters)` on `threads` threads released together; returns the wall time.
fn timed_on_threads<F>(threads: usize, iters: u64, work: F) -> Duration
where
    F: Fn(usize, u64) + Sync,
{
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (barrier, work) = (&barrier, &work);
            scope.spawn(move || {
                barrier.wait();
                work(t, iters);
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

fn statistics(c: &mut Criterion) {
    let mut group = c.benchmark_group("statistics_record_pair");
    for threads in [1usize, 2] {
        group.bench_function(format!("{threads}_threads"), |b| {
            let stats = StatisticsCounters::new();
            b.iter_custom(|iters| {
                timed_on_threads(threads, iters, |_, iters| {
                    for _ in 0..iters {
                        stats.record_allocation(black_box(256));
                        stats.record_deallocation(black_box(256));
                    }
                })
            });
        });
    }
    group.finish();
}

fn tracking(c: &mut Criterion) {
    let mut group = c.benchmark_group("tracking_record_pair");
    for threads in [1usize, 2] {
        group.bench_function(format!("{threads}_threads"), |b| {
            let registry = TrackingRegistry::new();
            // A realistic background of live allocations.
            for i in 0..4096u64 {
                registry
                    .record_allocation((1 << 44) + i * 4096, 4096)
                    .unwrap();
            }
            b.iter_custom(|iters| {
                timed_on_threads(threads, iters, |t, iters| {
                    let base = (t as u64 + 1) << 40;
                    for i in 0..iters {
                        let addr = base + (i & 1023) * 256;
                        registry.record_allocation(black_box(addr), 256).unwrap();
                        registry.record_deallocation(black_box(addr), 256).unwrap();
                    }
                })
            });
        });
    }
    group.finish();
}

fn csv(c: &mut Criterion) {
    let event = MemoryEvent::allocate(
        140_210_031_454_016,
        EventTime::new(14, 3, 27, 512_345).unwrap(),
        0x7f3a_1c00_0000,
        1 << 20,
        0,
    );
    let mut out = Vec::with_capacity(1 << 16);
    c.bench_function("csv_write_event", |b| {
        b.iter(|| {
            if out.len() > 60_000 {
                out.clear();
            }
            write_event(&mut out, black_box(&event)).unwrap();
        })
    });
}

#[allow(missing_docs)] // criterion_group! generates an undocumented `pub fn benches`.
mod generated {
    use super::{csv, statistics, tracking};
    criterion::criterion_group!(benches, statistics, tracking, csv);
}
criterion_main!(generated::benches);
