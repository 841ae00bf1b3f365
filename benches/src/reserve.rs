//! Peak reserved against peak live memory without a GPU: the peer comparison's pool and
//! binning cells replayed over simulated memory ([`SimulatedMemoryResource`], addresses only)
//! on the simulated driver's fake streams, one stream per copy of the workload as in the peer
//! run (`examples/peer simulate`; the runs: `docs/perf-log/2026-11-26-steal-before-growing.md`,
//! `2026-11-26-growth-under-pressure.md`, `2026-11-26-blocks-in-transit.md`).
//!
//! Two ways to replay, both with every copy on its own ordinary stream:
//!
//! - [`Replay::RoundRobin`]: on the calling thread, operation `i` of every copy before operation
//!   `i + 1` of any (deterministic: the same figures on every machine);
//! - [`Replay::Threads`]: one host thread per copy, started together, as the peer run replays
//!   (the figures may vary a little from run to run with the interleaving).
//!
//! The resource sits over a statistics adaptor over the simulated memory, as over the CUDA
//! resource in the peer run, and the peak reserved is the adaptor's peak bytes over all passes.

use std::sync::Barrier;

use rmm_mr::{
    BinningMemoryResource, BinningOptions, DeviceMemoryResource, MrError, MrResult,
    PoolMemoryResource, SimulatedMemoryResource, StatisticsResourceAdaptor,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::fault::DriverCall;
use rmm_sys::DevicePtr;

use crate::{Op, Trace};

/// The simulated device's size: more than any workload of the peer plan asks for (the pool
/// has no maximum, so it never fails before this).
const SIMULATED_BYTES: usize = 1 << 50;

/// Which resource to replay over simulated memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimResource {
    /// `PoolMemoryResource` of initial size 0 (the peer run's `pool`).
    Pool,
    /// `BinningMemoryResource` with bins `2^min_exp..2^max_exp` over a pool of initial size 0
    /// (the peer run's `binning`).
    Binning {
        /// Smallest bin exponent.
        min_exp: u32,
        /// Largest bin exponent.
        max_exp: u32,
    },
}

impl SimResource {
    /// The peer run's name of the resource.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::Binning { .. } => "binning",
        }
    }
}

/// How the copies are replayed (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// One thread, operation by operation across the copies.
    RoundRobin,
    /// One host thread per copy.
    Threads,
    /// One thread, a random copy at each step (seeded).
    Shuffled {
        /// The generator's seed.
        seed: u64,
    },
}

/// The memory figures of one simulated cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// The most bytes the resource took from the simulated memory at once.
    pub peak_reserved: usize,
    /// The workload's peak live bytes times the number of copies (the peer run's figure).
    pub peak_live: usize,
    /// Device synchronizations the resource made (`cuCtxSynchronize`, simulated), all threads.
    pub synchronizations: u64,
}

/// Replays `threads` copies of `trace`, `passes` times, against a fresh `resource` over
/// simulated memory, each copy on its own fake ordinary stream, and returns the peak reserved
/// and the peak live bytes. The caller's thread (and, with [`Replay::Threads`], every replay
/// thread) simulates the driver for the duration.
pub fn simulate_reserved(
    resource: SimResource,
    trace: &Trace,
    threads: usize,
    passes: usize,
    replay: Replay,
) -> MrResult<Reserved> {
    let _sim = rmm_sys::fault::FaultScope::simulated();
    let stats = StatisticsResourceAdaptor::new(SimulatedMemoryResource::new(SIMULATED_BYTES)?);
    let mr: Box<dyn DeviceMemoryResource> = match resource {
        SimResource::Pool => Box::new(PoolMemoryResource::new(stats.clone(), 0)?),
        SimResource::Binning { min_exp, max_exp } => Box::new(BinningMemoryResource::with_options(
            PoolMemoryResource::new(stats.clone(), 0)?,
            BinningOptions::new()
                .min_size_exponent(min_exp)
                .max_size_exponent(max_exp),
        )?),
    };
    // Owning streams, as on the GPU: a thief can pin one and record on it.
    let owned: Vec<CudaStream> = (0..threads)
        .map(|t| CudaStream::simulated(u32::try_from(t + 1).unwrap_or(u32::MAX)))
        .collect();
    let streams: Vec<CudaStreamView<'_>> = owned.iter().map(CudaStream::view).collect();
    let synchronizations = match replay {
        Replay::RoundRobin => {
            crate::capacity::replay_round_robin(&*mr, trace, &streams, passes)?;
            rmm_sys::fault::calls(DriverCall::Synchronize)
        }
        Replay::Threads => replay_on_threads(&*mr, trace, &streams, passes)?,
        Replay::Shuffled { seed } => {
            replay_shuffled(&*mr, trace, &streams, passes, seed)?;
            rmm_sys::fault::calls(DriverCall::Synchronize)
        }
    };
    drop(mr);
    Ok(Reserved {
        peak_reserved: usize::try_from(stats.bytes_counter().peak).unwrap_or(usize::MAX),
        peak_live: trace.peak_bytes().saturating_mul(threads),
        synchronizations,
    })
}

/// One host thread per stream, each replaying `trace` `passes` times on its stream, started
/// together at each pass; returns the device synchronizations of all threads.
fn replay_on_threads(
    mr: &dyn DeviceMemoryResource,
    trace: &Trace,
    streams: &[CudaStreamView<'_>],
    passes: usize,
) -> MrResult<u64> {
    let barrier = Barrier::new(streams.len());
    std::thread::scope(|s| {
        let joins: Vec<_> = streams
            .iter()
            .map(|&stream| {
                let barrier = &barrier;
                s.spawn(move || -> MrResult<u64> {
                    let _sim = rmm_sys::fault::FaultScope::simulated();
                    let mut failed = None;
                    for _ in 0..passes {
                        barrier.wait();
                        if failed.is_none() {
                            failed = replay_once(mr, trace, stream).err();
                        }
                    }
                    failed.map_or(Ok(rmm_sys::fault::calls(DriverCall::Synchronize)), Err)
                })
            })
            .collect();
        joins.into_iter().try_fold(0, |sum, j| {
            j.join()
                .unwrap_or_else(|_| Err(MrError::bad_alloc("a replay thread panicked")))
                .map(|n| sum + n)
        })
    })
}

/// On the calling thread, `passes` times: every copy (one per stream) replays `trace`, a copy
/// drawn at random (seeded) taking the next step; a pass ends when every copy finished it.
fn replay_shuffled(
    mr: &dyn DeviceMemoryResource,
    trace: &Trace,
    streams: &[CudaStreamView<'_>],
    passes: usize,
    seed: u64,
) -> MrResult<()> {
    let mut rng = crate::Rng::new(seed);
    let mut held = vec![vec![(DevicePtr::NULL, 0usize); trace.slots]; streams.len()];
    let mut result = Ok(());
    'passes: for _ in 0..passes {
        let mut next = vec![0usize; streams.len()];
        // The copies not yet through this pass.
        let mut running: Vec<usize> = (0..streams.len()).collect();
        while !running.is_empty() {
            let k = rng.range(0, running.len() - 1);
            let t = running[k];
            let (stream, i) = (streams[t], next[t]);
            if let Err(e) = step(mr, stream, &mut held[t], trace.ops[i]) {
                result = Err(MrError::bad_alloc(format!(
                    "copy {t}, operation {i} of {} failed: {e}",
                    trace.ops.len()
                )));
                break 'passes;
            }
            next[t] += 1;
            if next[t] == trace.ops.len() {
                running.swap_remove(k);
            }
        }
    }
    for (&stream, slots) in streams.iter().zip(held) {
        for (p, size) in slots.into_iter().filter(|(p, _)| !p.is_null()) {
            // SAFETY: each live slot holds a pointer from `mr` with its size, freed once.
            let _ = unsafe { mr.deallocate(stream, p, size, 256) };
        }
    }
    result
}

/// One operation of a copy on `stream`, its live pointers in `held` (by slot).
fn step(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    held: &mut [(DevicePtr, usize)],
    op: Op,
) -> MrResult<()> {
    match op {
        Op::Alloc { slot, size } => mr.allocate(stream, size, 256).map(|p| {
            held[slot as usize] = (p, size);
        }),
        Op::Free { slot } => {
            let (p, size) = std::mem::replace(&mut held[slot as usize], (DevicePtr::NULL, 0));
            // SAFETY: `p` came from `mr` with `size` on this stream, freed once (the slot is
            // emptied here).
            unsafe { mr.deallocate(stream, p, size, 256) }
        }
    }
}

/// Replays `trace` once on `stream`, freeing what it holds if an operation fails.
fn replay_once(
    mr: &dyn DeviceMemoryResource,
    trace: &Trace,
    stream: CudaStreamView<'_>,
) -> MrResult<()> {
    let mut held = vec![(DevicePtr::NULL, 0usize); trace.slots];
    for (i, op) in trace.ops.iter().enumerate() {
        let step = match *op {
            Op::Alloc { slot, size } => mr.allocate(stream, size, 256).map(|p| {
                held[slot as usize] = (p, size);
            }),
            Op::Free { slot } => {
                let (p, size) = std::mem::replace(&mut held[slot as usize], (DevicePtr::NULL, 0));
                // SAFETY: `p` came from `mr` with `size` on this stream, freed once (the slot
                // is emptied above).
                unsafe { mr.deallocate(stream, p, size, 256) }
            }
        };
        if let Err(e) = step {
            for (p, size) in held.into_iter().filter(|(p, _)| !p.is_null()) {
                // SAFETY: each live slot holds a pointer from `mr` with its size, freed once.
                let _ = unsafe { mr.deallocate(stream, p, size, 256) };
            }
            return Err(MrError::bad_alloc(format!(
                "operation {i} of {} ({op:?}) failed: {e}",
                trace.ops.len()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four copies of a small trace on four streams: the pool reserves no more than what one
    /// copy alone would need four times over (the pool's growth doubles, so one growth too many
    /// would double it).
    #[test]
    fn four_streams_reserve_what_they_live() {
        let trace = Trace::random(4000, 1, 64 << 10, 200, 7);
        let one = simulate_reserved(SimResource::Pool, &trace, 1, 2, Replay::RoundRobin).unwrap();
        let four = simulate_reserved(SimResource::Pool, &trace, 4, 2, Replay::RoundRobin).unwrap();
        assert!(one.peak_reserved >= one.peak_live);
        assert!(four.peak_reserved >= four.peak_live);
        assert!(
            four.peak_reserved <= 4 * one.peak_reserved,
            "4 streams reserve {} bytes, 1 stream {}",
            four.peak_reserved,
            one.peak_reserved
        );
    }

    /// The same bound with the copies drifting apart ([`Replay::Shuffled`]), for the pool and
    /// for binning (small bins over the pool, whose doubling quantizes what it reserves); and a
    /// seed replays the same schedule.
    #[test]
    fn four_streams_reserve_what_they_live_in_any_order() {
        let trace = Trace::random(4000, 1, 64 << 10, 200, 7);
        let binning = SimResource::Binning {
            min_exp: 10,
            max_exp: 14,
        };
        for resource in [SimResource::Pool, binning] {
            let one = simulate_reserved(resource, &trace, 1, 2, Replay::RoundRobin).unwrap();
            for seed in 1..=3 {
                let replay = Replay::Shuffled { seed };
                let four = simulate_reserved(resource, &trace, 4, 2, replay).unwrap();
                assert!(four.peak_reserved >= four.peak_live);
                assert!(
                    four.peak_reserved <= 4 * one.peak_reserved,
                    "{}, seed {seed}: 4 streams reserve {} bytes, 1 stream {}",
                    resource.name(),
                    four.peak_reserved,
                    one.peak_reserved
                );
                let again = simulate_reserved(resource, &trace, 4, 2, replay).unwrap();
                assert_eq!(again, four, "seed {seed} replayed differently");
            }
        }
    }
}
