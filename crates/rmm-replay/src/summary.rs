//! The numbers a replay reports, computed from the bytes in use and reserved after each step.

use std::fmt;
use std::time::Duration;

use rmm::mr::{DeviceMemoryResource, HumanBytes};
use rmm::stream::CudaStreamView;

use crate::plan::{Op, Position, Workload};
use crate::replay::{Replay, StepFailure};

/// Peaks of a replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peaks {
    /// The most bytes in use (as requested) after any step.
    pub in_use: u64,
    /// The first step where bytes in use peaked (`None` for an empty replay).
    pub in_use_step: Option<usize>,
    /// Bytes reserved after that step.
    pub reserved_at_peak: u64,
    /// The most bytes reserved after any step.
    pub reserved: u64,
    /// Fragmentation at the peak: the share of the reserved bytes that were not in use when
    /// bytes in use peaked, `1 - in_use / reserved_at_peak` (0 when nothing was reserved).
    /// It counts every byte the resource held beyond the live requests: rounding, free blocks
    /// between live ones, and memory its growth policy took ahead of need.
    pub fragmentation: f64,
}

impl Peaks {
    /// The peaks of `in_use` and `reserved`, one entry per step (only the steps present in
    /// both count).
    #[must_use]
    pub fn of(in_use: &[u64], reserved: &[u64]) -> Peaks {
        let n = in_use.len().min(reserved.len());
        let (in_use, reserved) = (&in_use[..n], &reserved[..n]);
        // The first index of the maximum.
        let step = in_use
            .iter()
            .enumerate()
            .fold(None, |best: Option<(usize, u64)>, (i, &v)| match best {
                Some((_, b)) if b >= v => best,
                _ => Some((i, v)),
            })
            .map(|(i, _)| i);
        let peak = step.map_or(0, |i| in_use[i]);
        let reserved_at_peak = step.map_or(0, |i| reserved[i]);
        let fragmentation = if reserved_at_peak == 0 {
            0.0
        } else {
            1.0 - peak as f64 / reserved_at_peak as f64
        };
        Peaks {
            in_use: peak,
            in_use_step: step,
            reserved_at_peak,
            reserved: reserved.iter().copied().max().unwrap_or(0),
            fragmentation,
        }
    }
}

/// What `rmm-replay` prints for one log.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The log's name (its path as given).
    pub log: String,
    /// The resource, in words.
    pub resource: String,
    /// Rows of the log (entries of a PyTorch trace).
    pub rows: usize,
    /// What positions (`peak_line`, the failed step's) count: lines or trace entries.
    pub position: Position,
    /// Allocations made before a PyTorch trace began, replayed first.
    pub before_trace: usize,
    /// Threads of the log that replayed something.
    pub threads: usize,
    /// Streams of the log.
    pub streams: usize,
    /// Allocations the log has (successful ones).
    pub allocations_in_log: usize,
    /// Allocations replayed.
    pub allocations: usize,
    /// Frees replayed.
    pub frees: usize,
    /// `allocate failure` rows of the log (counted, not replayed).
    pub failures_in_log: usize,
    /// Frees skipped: their pointer was not allocated earlier in the log.
    pub unmatched_frees: usize,
    /// Allocations the log never frees and their bytes.
    pub leaked: (usize, u64),
    /// The peaks.
    pub peaks: Peaks,
    /// The line of the step where bytes in use peaked.
    pub peak_line: Option<usize>,
    /// The wall time of the replay.
    pub wall: Duration,
    /// The step the resource failed, if any.
    pub failure: Option<StepFailure>,
    /// The logged id of the failed step's thread.
    pub failure_thread: Option<u64>,
    /// The largest single allocation the resource served after the replay, everything freed
    /// ([`largest_allocation`]), and the bound it was searched up to; `None` when it was not
    /// probed.
    pub largest_after: Option<(u64, u64)>,
    /// How many times the resource grew during the replay ([`Target::growths`](crate::Target::growths));
    /// `None` when it does not say.
    pub growths: Option<u64>,
}

impl Summary {
    /// The summary of `replay`, a replay of `workload` (whose bytes in use come from the plan;
    /// `reserved` is the replay's, or the bytes in use for resources that reserve nothing
    /// more, and `reserved_high` a high watermark the resource kept, if any).
    #[must_use]
    pub fn new(
        log: impl Into<String>,
        resource: impl Into<String>,
        workload: &Workload,
        replay: &Replay,
        reserved: &[u64],
        reserved_high: Option<u64>,
    ) -> Summary {
        let ran = replay.steps_run();
        let in_use = &workload.in_use[..ran.min(workload.in_use.len())];
        let mut peaks = Peaks::of(in_use, reserved);
        if let Some(high) = reserved_high {
            peaks.reserved = peaks.reserved.max(high);
        }
        let steps = &workload.steps[..ran.min(workload.steps.len())];
        let allocations = steps
            .iter()
            .filter(|s| matches!(s.op, Op::Allocate { .. }))
            .count();
        Summary {
            log: log.into(),
            resource: resource.into(),
            rows: workload.rows,
            position: workload.position,
            before_trace: workload.before_trace,
            threads: workload.threads.len(),
            streams: workload.streams.len(),
            allocations_in_log: workload.allocations(),
            allocations,
            frees: steps.len() - allocations,
            failures_in_log: workload.failures,
            unmatched_frees: workload.unmatched_frees,
            leaked: (workload.leaked.len(), workload.leaked_bytes()),
            peak_line: peaks.in_use_step.map(|i| workload.steps[i].line),
            peaks,
            wall: replay.wall,
            failure_thread: replay
                .failure
                .as_ref()
                .map(|f| workload.threads[f.at.thread as usize]),
            failure: replay.failure.clone(),
            largest_after: None,
            growths: None,
        }
    }

    /// Peak bytes reserved over peak bytes in use (1.0 when nothing was in use).
    #[must_use]
    pub fn reserved_to_live(&self) -> f64 {
        if self.peaks.in_use == 0 {
            1.0
        } else {
            self.peaks.reserved as f64 / self.peaks.in_use as f64
        }
    }

    /// The one-line message of a failed replay: where it ran out and why.
    #[must_use]
    pub fn failure_message(&self) -> Option<String> {
        let f = self.failure.as_ref()?;
        let what = match f.at.op {
            Op::Allocate { size, .. } => format!("allocating {}", format_bytes(size as u64)),
            Op::Free { size, .. } => format!("freeing {}", format_bytes(size as u64)),
        };
        let thread = self.failure_thread.unwrap_or_default();
        let verb = if f.error.is_out_of_memory() {
            "ran out of memory"
        } else {
            "the resource failed"
        };
        Some(format!(
            "{} {} {}: {verb} {what} on thread {thread}: {}",
            self.log,
            self.position.noun(),
            f.at.line,
            f.error
        ))
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", self.log, self.resource)?;
        let row = |f: &mut fmt::Formatter<'_>, label: &str, value: String| {
            writeln!(f, "  {label:<27} {value}")
        };
        let rows = match self.position {
            Position::Line => "log rows",
            Position::Entry => "trace entries",
        };
        row(
            f,
            rows,
            format!(
                "{} ({}, {})",
                self.rows,
                count(self.threads, "thread"),
                count(self.streams, "stream")
            ),
        )?;
        let partial = if self.allocations == self.allocations_in_log {
            String::new()
        } else {
            format!(" of {}", self.allocations_in_log)
        };
        row(
            f,
            "allocations replayed",
            format!("{}{partial}", self.allocations),
        )?;
        row(f, "frees replayed", self.frees.to_string())?;
        if self.before_trace > 0 {
            row(
                f,
                "allocated before the trace",
                format!(
                    "{} (replayed first)",
                    count(self.before_trace, "allocation")
                ),
            )?;
        }
        row(
            f,
            "failures in the log",
            format!("{} (counted, not replayed)", self.failures_in_log),
        )?;
        if self.unmatched_frees > 0 {
            row(
                f,
                "frees without allocation",
                format!("{} (skipped)", self.unmatched_frees),
            )?;
        }
        let at = self
            .peak_line
            .map(|l| format!(" at {} {l}", self.position.noun()))
            .unwrap_or_default();
        row(
            f,
            "peak bytes in use",
            format!("{}{at}", bytes_and_count(self.peaks.in_use)),
        )?;
        row(
            f,
            "peak bytes reserved",
            bytes_and_count(self.peaks.reserved),
        )?;
        row(
            f,
            "fragmentation at the peak",
            format!(
                "{:.1}% ({} reserved then, not in use)",
                self.peaks.fragmentation * 100.0,
                format_bytes(
                    self.peaks.reserved_at_peak
                        - self.peaks.in_use.min(self.peaks.reserved_at_peak)
                )
            ),
        )?;
        row(
            f,
            "peak reserved / peak in use",
            format!("{:.2}", self.reserved_to_live()),
        )?;
        if let Some(growths) = self.growths {
            row(
                f,
                "growths",
                format!("{growths} (chunks taken from the upstream or mapped)"),
            )?;
        }
        if let Some((largest, limit)) = self.largest_after {
            row(
                f,
                "largest allocation after",
                format!(
                    "{} ({:.1}% of {} probed, everything freed)",
                    format_bytes(largest),
                    100.0 * largest as f64 / limit.max(1) as f64,
                    format_bytes(limit)
                ),
            )?;
        }
        if self.leaked.0 > 0 {
            row(
                f,
                "never freed in the log",
                format!(
                    "{}, {} (freed after the replay)",
                    count(self.leaked.0, "allocation"),
                    format_bytes(self.leaked.1)
                ),
            )?;
        }
        row(f, "wall time", format_duration(self.wall))?;
        if let Some(message) = self.failure_message() {
            row(f, "FAILED", message)?;
        }
        Ok(())
    }
}

/// The largest allocation of at most `limit` bytes that `mr` serves on `stream`, to within
/// `resolution` bytes: a binary search, each probe allocated and freed at once. Any failure
/// counts as "not served". A probe may make a growing resource grow (and keep what it grew).
pub fn largest_allocation(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    limit: u64,
    resolution: u64,
) -> u64 {
    let served = |bytes: u64| -> bool {
        let Ok(size) = usize::try_from(bytes) else {
            return false;
        };
        match mr.allocate(stream, size, 256) {
            Ok(p) => {
                // SAFETY: just allocated on `stream` with these arguments; nothing used it.
                let freed = unsafe { mr.deallocate(stream, p, size, 256) };
                freed.is_ok()
            }
            Err(_) => false,
        }
    };
    if limit == 0 || served(limit) {
        return limit;
    }
    // Every size up to `ok` was served (0: none tried), `bad` was not.
    let (mut ok, mut bad) = (0u64, limit);
    while bad - ok > resolution.max(1) {
        let mid = ok + (bad - ok) / 2;
        if served(mid) {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    ok
}

/// `"1 thread"`, `"3 threads"`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `"132.0 MiB (138420836 B)"`.
fn bytes_and_count(bytes: u64) -> String {
    if bytes < 1024 {
        format_bytes(bytes)
    } else {
        format!("{} ({bytes} B)", format_bytes(bytes))
    }
}

/// Bytes with a binary unit and two decimals: `100 B`, `1.50 KiB`, `80.00 GiB`
/// ([`HumanBytes`] at two decimals).
#[must_use]
pub fn format_bytes(bytes: u64) -> String {
    format!("{:.2}", HumanBytes(bytes))
}

/// `"12.345 ms"`, `"1.234 s"`, `"850 µs"`.
#[must_use]
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs >= 1.0 {
        format!("{secs:.3} s")
    } else if secs >= 1e-3 {
        format!("{:.3} ms", secs * 1e3)
    } else {
        format!("{:.1} µs", secs * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_take_the_first_maximum_and_its_reserved_bytes() {
        let in_use = [1000, 4000, 3000, 4000, 500];
        let reserved = [4096, 8192, 8192, 16384, 16384];
        let p = Peaks::of(&in_use, &reserved);
        assert_eq!(p.in_use, 4000);
        assert_eq!(p.in_use_step, Some(1));
        assert_eq!(p.reserved_at_peak, 8192);
        assert_eq!(p.reserved, 16384);
        assert!((p.fragmentation - (1.0 - 4000.0 / 8192.0)).abs() < 1e-12);
    }

    #[test]
    fn peaks_of_nothing_are_zero() {
        let p = Peaks::of(&[], &[]);
        assert_eq!((p.in_use, p.in_use_step, p.reserved), (0, None, 0));
        assert_eq!(p.fragmentation, 0.0);
        // Nothing reserved (cannot happen with memory in use, but never divides by zero).
        assert_eq!(Peaks::of(&[5], &[0]).fragmentation, 0.0);
        // Only steps present in both series count.
        assert_eq!(Peaks::of(&[1, 9], &[4]).in_use, 1);
    }

    #[test]
    fn the_largest_allocation_is_found_to_the_resolution() {
        use rmm::mr::{
            LimitingResourceAdaptor, PoolMemoryResource, PoolOptions, SimulatedMemoryResource,
        };
        let s = CudaStreamView::legacy();
        for limit in [0usize, 1000, 1 << 20, (5 << 20) + 12345] {
            let sim = SimulatedMemoryResource::new(1 << 30).unwrap();
            let mr = LimitingResourceAdaptor::new(sim, limit);
            let found = largest_allocation(&mr, s, 64 << 20, 1024);
            // The limit counts sizes rounded up to 256.
            let truth = (limit - limit % 256) as u64;
            assert!(
                found <= truth && truth - found < 1024 + 256,
                "{limit}: {found}"
            );
        }
        // A pool of at most 1 GiB serves all of it at once: the bound itself.
        let pool = PoolMemoryResource::with_options(
            SimulatedMemoryResource::new(2 << 30).unwrap(),
            PoolOptions::new(0).maximum_pool_size(1 << 30),
        )
        .unwrap();
        assert_eq!(largest_allocation(&pool, s, 1 << 30, 1 << 20), 1 << 30);
    }

    #[test]
    fn bytes_and_durations_read_well() {
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(80 << 30), "80.00 GiB");
        assert_eq!(bytes_and_count(138_420_836), "132.01 MiB (138420836 B)");
        assert_eq!(format_duration(Duration::from_micros(850)), "850.0 µs");
        assert_eq!(format_duration(Duration::from_micros(12_345)), "12.345 ms");
        assert_eq!(format_duration(Duration::from_millis(1234)), "1.234 s");
    }
}
