//! Arena capacity: the highest occupancy (live bytes / arena size) at which `threads` copies of
//! an allocation trace, each on its own stream, all complete against one
//! [`rmm_mr::ArenaMemoryResource`].
//!
//! Occupancy is counted as the benchmark counts it: `threads x` the trace's peak live bytes
//! ([`Trace::peak_bytes`]) over the arena size. Every stream replays the same trace in step
//! (exactly when round robin, roughly on threads), so the copies' peaks coincide and at its
//! peak the arena really holds about that many live bytes. Two ways to replay:
//!
//! - [`replay_round_robin`]: on the calling thread, operation `i` of every copy before
//!   operation `i + 1` of any, each copy on its own stream. Deterministic; with
//!   [`rmm_mr::SimulatedMemoryResource`] as the arena's upstream and
//!   the simulated driver's fake streams it needs no GPU (the *simulation*, `simulate`, under
//!   the feature `driver-hooks`).
//! - [`crate::replay_threads`]: one host thread per copy, each on its own real stream (the GPU
//!   run, as `gpu_alloc` replays its traces).
//!
//! [`scan`] tries rising occupancies and reports each outcome; the figure is the highest
//! occupancy below which every level completed ([`highest_complete`]).

#[cfg(feature = "driver-hooks")]
use rmm_mr::{ArenaMemoryResource, ArenaOptions, SimulatedMemoryResource};
use rmm_mr::{DeviceMemoryResource, MrError, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::{Op, Trace};

/// Replays `streams.len()` copies of `trace` on the calling thread, copy `t` on `streams[t]`,
/// interleaved operation by operation (round robin), `passes` times in a row on the same
/// resource (the benchmark's warm-up pass, then its timed one). On a failure everything the
/// copies hold is freed and the error says which copy failed at which operation.
pub fn replay_round_robin(
    mr: &dyn DeviceMemoryResource,
    trace: &Trace,
    streams: &[CudaStreamView<'_>],
    passes: usize,
) -> MrResult<()> {
    let mut held = vec![vec![(DevicePtr::NULL, 0usize); trace.slots]; streams.len()];
    for pass in 0..passes {
        for (i, op) in trace.ops.iter().enumerate() {
            for (t, &stream) in streams.iter().enumerate() {
                let held_t = &mut held[t];
                let step = match *op {
                    Op::Alloc { slot, size } => mr.allocate(stream, size, 256).map(|p| {
                        held_t[slot as usize] = (p, size);
                    }),
                    Op::Free { slot } => {
                        let (p, size) =
                            std::mem::replace(&mut held_t[slot as usize], (DevicePtr::NULL, 0));
                        // SAFETY: `p` came from `mr` with `size` on this copy's stream, freed
                        // once (the slot is emptied above).
                        unsafe { mr.deallocate(stream, p, size, 256) }
                    }
                };
                if let Err(e) = step {
                    free_all(mr, streams, held);
                    return Err(MrError::bad_alloc(format!(
                        "copy {t}, pass {pass}, operation {i} of {} ({op:?}) failed: {e}",
                        trace.ops.len()
                    )));
                }
            }
        }
    }
    Ok(())
}

fn free_all(
    mr: &dyn DeviceMemoryResource,
    streams: &[CudaStreamView<'_>],
    held: Vec<Vec<(DevicePtr, usize)>>,
) {
    for (&stream, slots) in streams.iter().zip(held) {
        for (p, size) in slots.into_iter().filter(|(p, _)| !p.is_null()) {
            // SAFETY: each live slot holds a pointer from `mr` with its size, freed once.
            let _ = unsafe { mr.deallocate(stream, p, size, 256) };
        }
    }
}

/// The simulation: `threads` copies of `trace` replayed round robin ([`replay_round_robin`])
/// `passes` times against an arena of `arena_bytes` over [`SimulatedMemoryResource`], each copy
/// on its own fake stream of rmm-sys's simulated driver. No GPU and no CUDA call are needed
/// (with a GPU present the arena also synchronizes the device when it makes room, which costs
/// nothing here). Feature `driver-hooks` (default).
#[cfg(feature = "driver-hooks")]
pub fn simulate(trace: &Trace, threads: usize, passes: usize, arena_bytes: usize) -> MrResult<()> {
    let streams: Vec<CudaStreamView<'static>> = (0..threads)
        .map(|t| CudaStreamView::simulated(u32::try_from(t + 1).unwrap_or(u32::MAX)))
        .collect();
    let memory = SimulatedMemoryResource::new(arena_bytes)?;
    let arena =
        ArenaMemoryResource::with_options(memory, ArenaOptions::new().arena_size(arena_bytes))?;
    replay_round_robin(&arena, trace, &streams, passes)
}

/// The arena size at which `threads` copies of a trace whose peak is `peak` bytes occupy
/// `percent` % of it, rounded down to 256 bytes.
#[must_use]
pub fn arena_bytes_for(peak: usize, threads: usize, percent: usize) -> usize {
    let bytes = (peak as u128 * threads as u128 * 100 / percent.max(1) as u128) as usize;
    crate::sizing::round_down(bytes, 256)
}

/// The occupancy, in percent with one decimal, of `threads` copies with peak `peak` in an arena
/// of `arena` bytes.
#[must_use]
pub fn occupancy(peak: usize, threads: usize, arena: usize) -> f64 {
    (peak as f64 * threads as f64 * 100.0 / arena as f64 * 10.0).round() / 10.0
}

/// One occupancy level tried.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// The occupancy asked for, in percent.
    pub percent: usize,
    /// The arena size it gave.
    pub arena_bytes: usize,
    /// `None` when every copy completed, else the failure.
    pub failure: Option<String>,
}

/// Tries each of `percents` in order with `run(arena_bytes)`, which builds an arena of that many
/// bytes and replays the copies; a failure is recorded, not returned.
pub fn scan(
    percents: &[usize],
    peak: usize,
    threads: usize,
    mut run: impl FnMut(usize) -> MrResult<()>,
) -> Vec<Level> {
    percents
        .iter()
        .map(|&percent| {
            let arena_bytes = arena_bytes_for(peak, threads, percent);
            let failure = run(arena_bytes).err().map(|e| e.to_string());
            Level {
                percent,
                arena_bytes,
                failure,
            }
        })
        .collect()
}

/// The highest level of `levels` (in the order tried) such that it and every level tried
/// before it completed.
#[must_use]
pub fn highest_complete(levels: &[Level]) -> Option<usize> {
    levels
        .iter()
        .take_while(|l| l.failure.is_none())
        .map(|l| l.percent)
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "driver-hooks")]
    use crate::sizing::MIB;

    #[test]
    fn sizes_and_the_figure() {
        assert_eq!(arena_bytes_for(1 << 30, 16, 80), 20 << 30);
        assert_eq!(arena_bytes_for(1000, 1, 100) % 256, 0);
        assert!((occupancy(1 << 30, 16, 20 << 30) - 80.0).abs() < 1e-9);
        let level = |percent, ok: bool| Level {
            percent,
            arena_bytes: 0,
            failure: (!ok).then(|| "no room".to_owned()),
        };
        let levels = [
            level(80, true),
            level(85, true),
            level(90, false),
            level(95, true),
        ];
        assert_eq!(highest_complete(&levels), Some(85));
        assert_eq!(highest_complete(&levels[2..]), None);
    }

    /// The simulation on a shorter trace (a) (20,000 operations instead of 100,000, one pass):
    /// 16 copies complete at 90 % occupancy; at 100 % (more live than the arena) they cannot.
    #[cfg(feature = "driver-hooks")]
    #[test]
    fn sixteen_copies_of_trace_a_fit_at_ninety_percent() {
        let trace = Trace::random(20_000, 1, 4 * MIB, 1000, 0xbe_2c4);
        let peak = trace.peak_bytes();
        let levels = scan(&[90, 101], peak, 16, |bytes| simulate(&trace, 16, 1, bytes));
        assert_eq!(levels[0].failure, None, "{levels:?}");
        let full = levels[1].failure.as_deref().unwrap_or("completed");
        assert!(full.contains("No room in arena"), "{full}");
        assert_eq!(highest_complete(&levels), Some(90));
    }
}
