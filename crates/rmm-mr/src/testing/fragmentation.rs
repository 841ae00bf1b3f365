//! Fragmentation workloads, measured the same way on a GPU (the `fragmentation` benchmark) and
//! on a host simulation (the VMM pool's host tests): a multi-stream workload in the manner of
//! RMM issue 2039 (several streams, mixed sizes, each block freed on another stream than the
//! one that allocated it), the peak bytes live and reserved while it runs, and afterwards the
//! largest single allocation the resource still serves ([`largest_allocation`]).
//!
//! No work runs on the device: a block is freed on another stream with nothing to order, so
//! the figures are the allocator's alone.

use rmm_stream::CudaStreamView;

use crate::error::{MrError, MrResult};
use crate::resource::DeviceMemoryResource;
use crate::testing::Rng;

/// The size in `[lo, hi]` (`0 < lo <= hi`) the generator's value `raw` stands for, log-uniform.
fn log_uniform(raw: u64, lo: usize, hi: usize) -> usize {
    let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
    let x = l + (h - l) * (raw >> 11) as f64 / (1u64 << 53) as f64;
    (x.exp() as usize).clamp(lo, hi)
}

/// One value of the workload's generator, with the two sizes it stands for: what another
/// program needs to replay [`run`]'s decisions exactly, with no generator nor floating point of
/// its own (the peer comparison with RMM C++ does). A run takes one value per decision, in
/// order: per step, `raw % 100 < large_percent` (a large allocation?), then the next value's
/// `small` or `large` (its size); a step that frees takes two more, `raw % live` (which block,
/// by index in the live list, removed as `Vec::swap_remove` does) and `raw % (streams - 1)` (the
/// stream it is freed on: `(own + 1 + that) % streams`); at the end every block still live, in
/// list order, takes one (its stream, the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// The generator's value.
    pub raw: u64,
    /// The small size it stands for (log-uniform in [`MultiStream::small`]).
    pub small: usize,
    /// The large size it stands for (log-uniform in [`MultiStream::large`]).
    pub large: usize,
}

/// One operation of the run in which every allocation succeeds ([`MultiStream::trace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An allocation of `bytes` on `stream` at `step`.
    Alloc {
        /// The step (0-based).
        step: usize,
        /// The stream it is made on.
        stream: usize,
        /// Bytes requested.
        bytes: usize,
    },
    /// A free of a block of `bytes` on `stream` at `step` (`steps` for the frees at the end).
    Free {
        /// The step (0-based; the workload's `steps` for the final frees).
        step: usize,
        /// The stream it is freed on.
        stream: usize,
        /// Bytes of the block.
        bytes: usize,
    },
}

/// The multi-stream workload: `steps` operations over `streams` streams; each step allocates
/// on the next stream (round robin) while the bytes live stay under `budget`, else frees a
/// random live block on another stream than its own. Sizes: `large_percent` % of the
/// allocations are large (log-uniform in `large`), the rest small (log-uniform in `small`).
/// At the end every block still live is freed, each on another stream than its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiStream {
    /// Number of streams (at least 2).
    pub streams: usize,
    /// Operations.
    pub steps: usize,
    /// The most bytes live at once (requested sizes).
    pub budget: usize,
    /// Small sizes, inclusive.
    pub small: (usize, usize),
    /// Large sizes, inclusive.
    pub large: (usize, usize),
    /// Share of large allocations, in percent.
    pub large_percent: usize,
    /// The generator's seed.
    pub seed: u64,
}

impl MultiStream {
    /// The workload scaled to a resource of at most `maximum` bytes: 4 streams, 4,000 steps,
    /// at most 60 % of `maximum` live, 1 in 5 allocations large (0.5-8 % of `maximum`), the
    /// others 256 B to 0.1 % of `maximum` (at least 256 B).
    #[must_use]
    pub fn scaled(maximum: usize) -> Self {
        let small_top = (maximum / 1000).max(256);
        Self {
            streams: 4,
            steps: 4000,
            budget: maximum / 10 * 6,
            small: (256, small_top),
            large: (
                (maximum / 200).max(small_top),
                (maximum / 100 * 8).max(small_top),
            ),
            large_percent: 20,
            seed: 0x2039,
        }
    }
}

impl MultiStream {
    /// The most generator values one run takes: two per step and, per allocation, two more
    /// (when it is freed during the steps, or at most that at the end), so at most four per
    /// step.
    #[must_use]
    pub fn max_draws(&self) -> usize {
        self.steps.saturating_mul(4)
    }

    /// The first `count` values of the workload's generator, each with the sizes it stands for
    /// ([`Draw`]); [`MultiStream::max_draws`] values are enough for a whole run.
    #[must_use]
    pub fn draws(&self, count: usize) -> Vec<Draw> {
        let mut rng = Rng::new(self.seed);
        (0..count)
            .map(|_| {
                let raw = rng.next_u64();
                Draw {
                    raw,
                    small: log_uniform(raw, self.small.0, self.small.1),
                    large: log_uniform(raw, self.large.0, self.large.1),
                }
            })
            .collect()
    }

    /// The operations of [`run`] when every allocation succeeds, in order: what another
    /// program replaying the workload from [`MultiStream::draws`] must do too, as a check of
    /// its replay. (A refused allocation changes what follows: the run goes on without it.)
    ///
    /// # Panics
    /// If `streams < 2` (the workload needs two).
    #[must_use]
    pub fn trace(&self) -> Vec<Event> {
        assert!(self.streams >= 2, "the workload needs at least 2 streams");
        let events = std::cell::RefCell::new(Vec::new());
        let out = drive(
            self,
            |stream, bytes, step| {
                events.borrow_mut().push(Event::Alloc {
                    step,
                    stream,
                    bytes,
                });
                Ok(Some(()))
            },
            |_, bytes, stream, step| {
                events.borrow_mut().push(Event::Free {
                    step,
                    stream,
                    bytes,
                });
                Ok(())
            },
            || 0,
        );
        debug_assert!(out.is_ok());
        events.into_inner()
    }
}

/// What a workload left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The most bytes live at once (requested sizes).
    pub peak_live: usize,
    /// The most bytes reserved at once, as the probe read it after each step.
    pub peak_reserved: usize,
    /// Bytes reserved at the end, everything freed.
    pub reserved_after: usize,
    /// Allocations that failed with out-of-memory (skipped; the workload goes on).
    pub failed: usize,
    /// Allocations made.
    pub allocations: usize,
}

/// Runs `workload` against `mr` on `streams` (at least `workload.streams` of them), reading
/// the bytes the resource holds with `reserved` after every step.
///
/// # Errors
/// A failure other than out-of-memory, or too few streams.
pub fn run(
    mr: &dyn DeviceMemoryResource,
    streams: &[CudaStreamView<'_>],
    workload: &MultiStream,
    reserved: &dyn Fn() -> usize,
) -> MrResult<Outcome> {
    let n = workload.streams;
    if n < 2 || streams.len() < n {
        return Err(MrError::invalid_argument(format!(
            "the workload needs {n} streams (at least 2), {} given",
            streams.len()
        )));
    }
    drive(
        workload,
        |s, bytes, _| match mr.allocate(streams[s], bytes, 256) {
            Ok(p) => Ok(Some(p)),
            Err(e) if e.is_out_of_memory() => Ok(None),
            Err(e) => Err(e),
        },
        |p, bytes, s, _| {
            // SAFETY: `p` came from `mr` with `bytes`; no work uses it, so any stream may free
            // it.
            unsafe { mr.deallocate(streams[s], p, bytes, 256) }
        },
        reserved,
    )
}

/// The workload's decisions ([`Draw`] says which values it takes, in order), with `alloc(stream,
/// bytes, step)` (`Ok(None)`: out of memory, the run goes on without it) and `free(block, bytes,
/// stream, step)` doing the work and `reserved` read after every step.
fn drive<P>(
    workload: &MultiStream,
    mut alloc: impl FnMut(usize, usize, usize) -> MrResult<Option<P>>,
    mut free: impl FnMut(P, usize, usize, usize) -> MrResult<()>,
    reserved: impl Fn() -> usize,
) -> MrResult<Outcome> {
    let n = workload.streams;
    let mut rng = Rng::new(workload.seed);
    // (block, bytes, stream it was allocated on)
    let mut live: Vec<(P, usize, usize)> = Vec::new();
    let mut out = Outcome {
        peak_live: 0,
        peak_reserved: 0,
        reserved_after: 0,
        failed: 0,
        allocations: 0,
    };
    let mut live_bytes = 0usize;
    let free_on_other = |rng: &mut Rng, own: usize| (own + 1 + rng.below(n - 1)) % n;
    for step in 0..workload.steps {
        let large = rng.below(100) < workload.large_percent;
        let (lo, hi) = if large {
            workload.large
        } else {
            workload.small
        };
        let bytes = log_uniform(rng.next_u64(), lo, hi);
        if live_bytes + bytes <= workload.budget || live.is_empty() {
            let s = step % n;
            match alloc(s, bytes, step)? {
                Some(p) => {
                    live.push((p, bytes, s));
                    live_bytes += bytes;
                    out.allocations += 1;
                }
                None => out.failed += 1,
            }
        } else {
            let (p, bytes, s) = live.swap_remove(rng.below(live.len()));
            let other = free_on_other(&mut rng, s);
            free(p, bytes, other, step)?;
            live_bytes -= bytes;
        }
        out.peak_live = out.peak_live.max(live_bytes);
        out.peak_reserved = out.peak_reserved.max(reserved());
    }
    for (p, bytes, s) in live.drain(..) {
        let other = free_on_other(&mut rng, s);
        free(p, bytes, other, workload.steps)?;
    }
    out.reserved_after = reserved();
    out.peak_reserved = out.peak_reserved.max(out.reserved_after);
    Ok(out)
}

/// The largest allocation of at most `upper` bytes that `mr` serves on `stream` now, to within
/// `resolution` bytes (a binary search; each probe is allocated and freed at once). A probe may
/// make a growing resource grow, so the answer is "the largest that succeeded", not a promise.
///
/// # Errors
/// A failure other than out-of-memory.
pub fn largest_allocation(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    upper: usize,
    resolution: usize,
) -> MrResult<usize> {
    let fits = |bytes: usize| -> MrResult<bool> {
        match mr.allocate(stream, bytes, 256) {
            Ok(p) => {
                // SAFETY: just allocated with these arguments; nothing used it.
                unsafe { mr.deallocate(stream, p, bytes, 256)? };
                Ok(true)
            }
            Err(e) if e.is_out_of_memory() => Ok(false),
            Err(e) => Err(e),
        }
    };
    if upper == 0 || fits(upper)? {
        return Ok(upper);
    }
    // Every size up to `ok` was served (0: none tried), `bad` was refused.
    let (mut ok, mut bad) = (0usize, upper);
    while bad - ok > resolution.max(1) {
        let mid = ok + (bad - ok) / 2;
        if fits(mid)? {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HostMockResource;
    use crate::LimitingResourceAdaptor;

    #[test]
    fn the_largest_allocation_is_found_to_the_resolution() {
        for limit in [0usize, 1000, 4096, 1 << 20, (5 << 20) + 12345] {
            let mr = LimitingResourceAdaptor::new(HostMockResource::new(), limit);
            let s = CudaStreamView::legacy();
            let found = largest_allocation(&mr, s, 64 << 20, 1024).unwrap();
            // The limit counts sizes rounded up to 256.
            let truth = limit - limit % 256;
            assert!(
                found <= truth && truth - found < 1024 + 256,
                "{limit}: {found}"
            );
            assert_eq!(mr.allocated_bytes(), 0);
        }
    }

    #[test]
    fn the_workload_is_deterministic_and_frees_everything() {
        let w = MultiStream {
            steps: 300,
            ..MultiStream::scaled(256 << 20)
        };
        let mock = HostMockResource::new();
        let streams = vec![CudaStreamView::legacy(); 4];
        let probe = || mock.live_bytes();
        let a = run(&mock, &streams, &w, &probe).unwrap();
        let b = run(&mock, &streams, &w, &probe).unwrap();
        assert_eq!(a, b);
        assert!(a.allocations > 100 && a.failed == 0, "{a:?}");
        assert!(
            a.peak_live <= w.budget && a.peak_live > w.budget / 2,
            "{a:?}"
        );
        assert_eq!((a.reserved_after, mock.live_allocations()), (0, 0));
        let e = run(&mock, &streams[..1], &w, &probe).unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
    }

    /// Replays the workload from its draws the way the peer comparison's C++ side does (no
    /// generator, no floating point): the rules [`Draw`] states.
    fn replay_from_draws(w: &MultiStream, draws: &[Draw]) -> Vec<Event> {
        let mut d = draws.iter();
        let mut next = || *d.next().expect("max_draws values are enough");
        let n = w.streams as u64;
        let mut live: Vec<(usize, usize)> = Vec::new();
        let (mut live_bytes, mut events) = (0usize, Vec::new());
        for step in 0..w.steps {
            let large = next().raw % 100 < w.large_percent as u64;
            let size = next();
            let bytes = if large { size.large } else { size.small };
            if live_bytes + bytes <= w.budget || live.is_empty() {
                let stream = step % w.streams;
                events.push(Event::Alloc {
                    step,
                    stream,
                    bytes,
                });
                live.push((bytes, stream));
                live_bytes += bytes;
            } else {
                let (bytes, own) = live.swap_remove((next().raw % live.len() as u64) as usize);
                let stream = ((own as u64 + 1 + next().raw % (n - 1)) % n) as usize;
                events.push(Event::Free {
                    step,
                    stream,
                    bytes,
                });
                live_bytes -= bytes;
            }
        }
        for (bytes, own) in live {
            let stream = ((own as u64 + 1 + next().raw % (n - 1)) % n) as usize;
            events.push(Event::Free {
                step: w.steps,
                stream,
                bytes,
            });
        }
        events
    }

    #[test]
    fn the_draws_replay_the_trace_and_the_trace_is_the_run() {
        for w in [
            MultiStream::scaled(1 << 30),
            MultiStream {
                steps: 500,
                streams: 3,
                ..MultiStream::scaled(64 << 20)
            },
        ] {
            let trace = w.trace();
            let draws = w.draws(w.max_draws());
            assert_eq!(draws.len(), w.steps * 4);
            assert_eq!(replay_from_draws(&w, &draws), trace);
            // Every allocation is freed once, on another stream than its own.
            let allocs = trace
                .iter()
                .filter(|e| matches!(e, Event::Alloc { .. }))
                .count();
            assert_eq!(allocs * 2, trace.len());
            assert!(trace
                .iter()
                .all(|e| !matches!(e, Event::Free { step, .. } if *step > w.steps)));
            // The run over a mock makes the same allocations (it fails none).
            let mock = HostMockResource::new();
            let streams = vec![CudaStreamView::legacy(); w.streams];
            let out = run(&mock, &streams, &w, &|| mock.live_bytes()).unwrap();
            assert_eq!((out.allocations, out.failed), (allocs, 0));
            // The draws start where the generator does, and their sizes lie in range.
            assert_eq!(draws[0].raw, Rng::new(w.seed).next_u64());
            assert!(draws
                .iter()
                .all(|d| (w.small.0..=w.small.1).contains(&d.small)
                    && (w.large.0..=w.large.1).contains(&d.large)));
        }
    }
}
