//! Host-side cost of the pinned host pool's bookkeeping (`PinnedLedger`, no CUDA call): what a
//! warm `PinnedHostPool` adds to an allocation besides its lock and, for recorded blocks, the
//! driver's event calls.
//!
//! * `take_free`: a hit on a class's free list and the free back (no events), for one size and
//!   for a mix of classes;
//! * `record_reclaim`: a block freed with one recorded event, reclaimed once the event is done,
//!   then taken again (the path of every block a copy used).
//!
//! `cargo bench -p rmm-mr --bench pinned_ledger`; the GPU cost of the same operations, and of
//! `cuMemHostAlloc`, is `benches/benches/pinned_host.rs`.

use std::hint::black_box;

use criterion::{criterion_main, Criterion};
use rmm_mr::__internals::pinned::{chunk_bytes_for, class_of, PinnedLedger};

/// A ledger with one chunk for each size of `sizes` (fake page-aligned addresses), every block
/// freed again.
fn warm(sizes: &[usize]) -> PinnedLedger<u32> {
    let mut l = PinnedLedger::new();
    let mut base = 1usize << 40;
    for &s in sizes {
        let bytes = chunk_bytes_for(class_of(s).unwrap());
        let a = l.add_chunk(base, bytes, s).unwrap();
        l.free(a).unwrap();
        base += bytes;
    }
    l
}

fn take_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("pinned_ledger/take_free");
    let mut one = warm(&[64 << 10]);
    group.bench_function("one_class_64KiB", |b| {
        b.iter(|| {
            let a = one.take(black_box(64 << 10)).unwrap().unwrap();
            one.free(a).unwrap();
        })
    });
    let sizes = [300usize, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 16 << 20];
    let mut mixed = warm(&sizes);
    let mut i = 0;
    group.bench_function("six_classes", |b| {
        b.iter(|| {
            let s = sizes[i % sizes.len()];
            i += 1;
            let a = mixed.take(black_box(s)).unwrap().unwrap();
            mixed.free(a).unwrap();
        })
    });
    group.finish();
}

fn record_reclaim(c: &mut Criterion) {
    let mut l = warm(&[1 << 20]);
    let mut e = 0u32;
    c.bench_function("pinned_ledger/record_reclaim", |b| {
        b.iter(|| {
            let a = l.take(black_box(1 << 20)).unwrap().unwrap();
            e = e.wrapping_add(1);
            l.record(a, e).unwrap();
            l.free(a).unwrap();
            black_box(l.reclaim(|_| true));
        })
    });
}

#[allow(missing_docs)] // criterion_group! generates an undocumented `pub fn benches`.
mod generated {
    use super::{record_reclaim, take_free};
    criterion::criterion_group!(benches, take_free, record_reclaim);
}
criterion_main!(generated::benches);
