//! The same-stream hot path of the stream-ordered sub-allocators (fixed-size, binning, pool):
//! what their own bookkeeping costs per allocate + deallocate pair.
//!
//! The upstream is a do-nothing resource ([`NullResource`]): distinct fake 256-aligned
//! addresses from a bump counter, never touched, frees ignored; so the time measured is the
//! sub-allocator's own work. Everything runs on one thread and one stream, as the GPU trace
//! does: `legacy` (no CUDA call at all) and `per_thread` (the per-thread list cache, the path an
//! ordinary stream takes after its `cuStreamGetId`).
//!
//! Size mixes are those of the GPU trace (`benches/gpu_alloc.rs`): uniform in 1 B-4 MiB and
//! in 1 B-64 KiB. Two shapes, each timed per pair (two operations):
//!
//! - `pair/...`: allocate then free at once, with [`LIVE`] allocations of the same mix held in
//!   the background (the free lists and maps have realistic sizes);
//! - `steady/...`: [`LIVE`] allocations live; each iteration frees a pseudo-randomly chosen one
//!   and allocates a new size in its place (the trace's steady state).
//!
//! Resources: `fixed_size` (block = the mix's largest size, 128 blocks per chunk, as the GPU
//! benchmark), `binning` (exponents 18..=22 over a pool, as the GPU benchmark), `pool` (grown
//! on demand) and `vmm_pool` (over simulated memory: growth is bookkeeping only); see
//! [`resources`] for which run on the per-thread stream.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_main, Criterion};
use rmm_mr::{
    shared, BinningMemoryResource, BinningOptions, DeviceMemoryResource, FixedSizeMemoryResource,
    FixedSizeOptions, PoolMemoryResource, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

mod common;

use common::{sequences, LIVE, SEQ};
use rmm_mr::testing::NullResource;

/// The allocations a benchmark holds, freed when it ends.
struct Held<'a> {
    mr: &'a dyn DeviceMemoryResource,
    stream: CudaStreamView<'static>,
    live: Vec<(DevicePtr, usize)>,
}

impl<'a> Held<'a> {
    fn fill(
        mr: &'a dyn DeviceMemoryResource,
        stream: CudaStreamView<'static>,
        sizes: &[usize],
    ) -> Self {
        let live = sizes[..LIVE]
            .iter()
            .map(|&b| (mr.allocate(stream, b, 256).unwrap(), b))
            .collect();
        Self { mr, stream, live }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for &(p, b) in &self.live {
            // SAFETY: each came from `mr` with `b` bytes and is freed once.
            unsafe { self.mr.deallocate(self.stream, p, b, 256).unwrap() };
        }
    }
}

/// The resources benchmarked on `stream` for sizes up to `max`. A fixed-size resource's first
/// chunk sits in the legacy stream's list, so on another stream its first allocation steals
/// (recording an event: a CUDA call); on the per-thread stream only resources that grow on the
/// calling stream run: the pool, and a binning resource whose bins are pools (as many stream
/// lists per thread as the fixed-size binning resource).
fn resources(
    max: usize,
    stream: CudaStreamView<'_>,
) -> Vec<(&'static str, Box<dyn DeviceMemoryResource>)> {
    let mut out: Vec<(&'static str, Box<dyn DeviceMemoryResource>)> = Vec::new();
    if stream.is_default() {
        out.push((
            "fixed_size",
            Box::new(
                FixedSizeMemoryResource::with_options(
                    NullResource::new(),
                    FixedSizeOptions::new()
                        .block_size(max)
                        .blocks_to_preallocate(128),
                )
                .unwrap(),
            ),
        ));
        let pool = PoolMemoryResource::new(NullResource::new(), 0).unwrap();
        out.push((
            "binning",
            Box::new(
                BinningMemoryResource::with_options(
                    pool,
                    BinningOptions::new()
                        .min_size_exponent(18)
                        .max_size_exponent(22),
                )
                .unwrap(),
            ),
        ));
    } else {
        let pool = PoolMemoryResource::new(NullResource::new(), 0).unwrap();
        let binning = BinningMemoryResource::new(pool);
        for i in 18..=22 {
            let bin = PoolMemoryResource::new(NullResource::new(), 0).unwrap();
            binning.add_bin(1 << i, Some(shared(bin))).unwrap();
        }
        out.push(("binning_of_pools", Box::new(binning)));
    }
    out.push((
        "pool",
        Box::new(PoolMemoryResource::new(NullResource::new(), 0).unwrap()),
    ));
    // The same core over simulated chunks (64 GiB of fake addresses, mapped as it grows).
    out.push((
        "vmm_pool",
        Box::new(VmmPoolMemoryResource::simulated(VmmPoolOptions::new(64 << 30)).unwrap()),
    ));
    out
}

fn hot_path(c: &mut Criterion) {
    let streams = [
        ("legacy", CudaStreamView::legacy()),
        ("per_thread", CudaStreamView::per_thread()),
    ];
    for (mix, max) in [("4MiB", 4usize << 20), ("64KiB", 64 << 10)] {
        let (sizes, slots) = sequences(max);
        for (stream_name, stream) in streams {
            for (name, mr) in resources(max, stream) {
                let mr: &dyn DeviceMemoryResource = &*mr;
                let id = format!("{name}/{mix}/{stream_name}");
                c.bench_function(&format!("pair/{id}"), |b| {
                    let _held = Held::fill(mr, stream, &sizes[SEQ - LIVE..]);
                    let mut i = 0;
                    b.iter(|| {
                        let bytes = sizes[i & (SEQ - 1)];
                        i += 1;
                        let p = mr.allocate(stream, black_box(bytes), 256).unwrap();
                        // SAFETY: `p` came from `mr` with `bytes`; freed once.
                        unsafe { mr.deallocate(stream, black_box(p), bytes, 256).unwrap() };
                    });
                });
                c.bench_function(&format!("steady/{id}"), |b| {
                    let mut held = Held::fill(mr, stream, &sizes);
                    let mut i = LIVE;
                    b.iter(|| {
                        let slot = &mut held.live[slots[i & (SEQ - 1)]];
                        let bytes = sizes[i & (SEQ - 1)];
                        i += 1;
                        // SAFETY: the slot's allocation came from `mr` with its size; freed once.
                        unsafe {
                            mr.deallocate(stream, black_box(slot.0), slot.1, 256)
                                .unwrap()
                        };
                        *slot = (mr.allocate(stream, black_box(bytes), 256).unwrap(), bytes);
                    });
                });
            }
        }
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
}

#[allow(missing_docs)] // criterion_group! generates an undocumented `pub fn benches`.
mod generated {
    use super::{config, hot_path};
    criterion::criterion_group! {
        name = benches;
        config = config();
        targets = hot_path
    }
}
criterion_main!(generated::benches);
