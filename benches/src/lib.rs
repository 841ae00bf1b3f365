//! Building blocks of the GPU allocation benchmarks: random allocation traces, their replay
//! through any [`DeviceMemoryResource`] on several threads (one stream each), and medians.
//!
//! The benchmark binary is `benches/gpu_alloc.rs`; `cargo xtask gpu bundle` builds it and
//! `run.sh bench` runs it on the GPU machine.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use rmm_mr::{DeviceMemoryResource, MrResult};
use rmm_stream::CudaStream;
use rmm_sys::DevicePtr;

/// One step of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes into `slot`.
    Alloc {
        /// The slot that holds the pointer until it is freed.
        slot: u32,
        /// Bytes to allocate.
        size: usize,
    },
    /// Free what `slot` holds.
    Free {
        /// The slot.
        slot: u32,
    },
}

/// A trace: `ops` operations, every allocation later freed (the final frees are part of it).
#[derive(Debug, Clone)]
pub struct Trace {
    /// The operations in order.
    pub ops: Vec<Op>,
    /// Number of slots used.
    pub slots: usize,
}

/// splitmix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

impl Trace {
    /// `ops` operations (allocations and frees together, final frees included) with sizes
    /// uniform in `[min_size, max_size]` and about `live` allocations outstanding: below `live`
    /// it allocates, above it frees, at `live` it flips a coin; the last `live` operations free
    /// whatever is left.
    #[must_use]
    pub fn random(ops: usize, min_size: usize, max_size: usize, live: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut out = Vec::with_capacity(ops);
        let mut free_slots: Vec<u32> = Vec::new();
        let mut used: Vec<u32> = Vec::new();
        let mut slots = 0u32;
        while out.len() + used.len() < ops {
            let alloc = used.len() < live || (used.len() == live && rng.next_u64() & 1 == 0);
            if alloc {
                let slot = free_slots.pop().unwrap_or_else(|| {
                    slots += 1;
                    slots - 1
                });
                out.push(Op::Alloc {
                    slot,
                    size: rng.range(min_size, max_size),
                });
                used.push(slot);
            } else {
                let i = rng.range(0, used.len() - 1);
                let slot = used.swap_remove(i);
                out.push(Op::Free { slot });
                free_slots.push(slot);
            }
        }
        for slot in used {
            out.push(Op::Free { slot });
        }
        Self {
            ops: out,
            slots: slots as usize,
        }
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
    for op in &trace.ops {
        match *op {
            Op::Alloc { slot, size } => {
                held[slot as usize] = (mr.allocate(view, size, 256)?, size);
            }
            Op::Free { slot } => {
                let (p, size) = held[slot as usize];
                // SAFETY: `p` came from `mr` with `size` on this stream, freed once.
                unsafe { mr.deallocate(view, p, size, 256)? };
            }
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
    let device = rmm_sys::current_device()?;
    let barrier = Barrier::new(streams.len() + 1);
    let results: Vec<MrResult<Duration>> = std::thread::scope(|s| {
        let joins: Vec<_> = streams
            .iter()
            .map(|stream| {
                let barrier = &barrier;
                s.spawn(move || -> MrResult<Duration> {
                    rmm_sys::set_current_device(device)?;
                    barrier.wait();
                    let start = Instant::now();
                    replay(mr, stream, trace)?;
                    Ok(start.elapsed())
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
    for r in results {
        worst = worst.max(r?);
    }
    Ok(worst)
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

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}
