//! One log, replayed as `rmm-replay` replays it: the resource built, the streams mapped, the
//! replay run, the summary and the plot's panel made.

use std::fmt;
use std::sync::atomic::AtomicUsize;

use rmm::stream::CudaStreamView;
use rmm::sys::CudaError;

use crate::plan::Workload;
use crate::plot::Panel;
use crate::replay::{replay, Replay, ReplayError};
use crate::summary::{largest_allocation, Summary};
use crate::target::{self, BuildError, BuildOptions, DeviceStreams, Memory, ResourceKind};

/// What one log's replay gave.
#[derive(Debug)]
pub struct Report {
    /// The numbers (with the failed step, if the resource failed one).
    pub summary: Summary,
    /// The series for the plot.
    pub panel: Panel,
    /// The replay itself (its [`cleanup_error`](Replay::cleanup_error) included).
    pub replay: Replay,
}

impl Report {
    /// Whether every step ran and everything was given back.
    #[must_use]
    pub fn succeeded(&self) -> bool {
        self.summary.failure.is_none() && self.replay.cleanup_error.is_none()
    }
}

/// Why a log could not be replayed at all.
#[derive(Debug)]
pub enum RunError {
    /// The resource could not be built.
    Build(BuildError),
    /// A stream of the log could not be created on the GPU.
    Stream(CudaError),
    /// The GPU's context could not be made current.
    Context(CudaError),
    /// The replay could not start.
    Replay(ReplayError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Build(e) => e.fmt(f),
            RunError::Stream(e) => write!(f, "cannot create a stream: {e}"),
            RunError::Context(e) => write!(f, "cannot make the GPU's context current: {e}"),
            RunError::Replay(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RunError {}

/// Replays `workload` (the log `name`) against a fresh resource of `kind` over `memory`: on the
/// GPU each stream of the log is a real stream ([`DeviceStreams`]); over simulated memory
/// everything runs on the legacy default stream. `progress` counts the steps done.
///
/// # Errors
///
/// [`RunError`] when the replay could not start; a step the resource failed is not an error
/// here but [`Summary::failure`].
pub fn replay_log(
    name: &str,
    workload: &Workload,
    kind: ResourceKind,
    memory: Memory,
    progress: &AtomicUsize,
) -> Result<Report, RunError> {
    replay_log_with(
        name,
        workload,
        kind,
        memory,
        BuildOptions::default(),
        progress,
    )
}

/// [`replay_log`] against a resource built with `options` ([`target::build_with`]).
///
/// # Errors
///
/// As [`replay_log`].
pub fn replay_log_with(
    name: &str,
    workload: &Workload,
    kind: ResourceKind,
    memory: Memory,
    options: BuildOptions,
    progress: &AtomicUsize,
) -> Result<Report, RunError> {
    if memory == Memory::Device {
        // The device's primary context is created here, before the replay, so that its creation
        // (tens of milliseconds) is not in the replay's wall time when the log's first step is
        // the first call that needs it (a log on the default streams only).
        rmm::sys::ensure_current_context().map_err(RunError::Context)?;
    }
    let target = target::build_with(kind, memory, workload, options).map_err(RunError::Build)?;
    let device_streams;
    let streams = match memory {
        Memory::Simulated(_) => target::simulated_streams(workload),
        Memory::Device => {
            device_streams = DeviceStreams::new(workload).map_err(RunError::Stream)?;
            device_streams.views()
        }
    };
    let r = replay(
        workload,
        &*target.resource,
        &streams,
        &|| target.reserved(),
        progress,
    )
    .map_err(RunError::Replay)?;

    let in_use = &workload.in_use[..r.steps_run()];
    let reserved: Vec<u64> = if target.reserved_is_in_use() {
        in_use.to_vec()
    } else {
        r.reserved.clone()
    };
    let mut summary = Summary::new(
        name,
        target.description.clone(),
        workload,
        &r,
        &reserved,
        target.reserved_high(),
    );
    summary.growths = target.growths();
    // What is left of the memory, as one allocation: everything was freed by the replay.
    summary.largest_after = target.probe_limit().map(|limit| {
        let resolution = (limit / 4096).max(256);
        let largest = largest_allocation(
            &*target.resource,
            CudaStreamView::legacy(),
            limit,
            resolution,
        );
        (largest, limit)
    });
    let panel = Panel {
        title: format!("{name}: {}", kind.name()),
        in_use: in_use.to_vec(),
        reserved,
        capacity: target.capacity,
        failed_at: r.failure.as_ref().map(|f| (f.step, f.at.line)),
        position: workload.position,
    };
    Ok(Report {
        summary,
        panel,
        replay: r,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../samples/sample.csv");

    #[test]
    fn the_sample_replays_over_simulated_memory_on_every_sub_allocator() {
        let workload = crate::load(SAMPLE.as_bytes()).unwrap();
        for kind in [
            ResourceKind::Pool,
            ResourceKind::Arena,
            ResourceKind::Binning,
            ResourceKind::Fixed,
            ResourceKind::Vmm,
        ] {
            let progress = AtomicUsize::new(0);
            let report = replay_log(
                "sample",
                &workload,
                kind,
                Memory::Simulated(4 << 30),
                &progress,
            )
            .unwrap();
            let s = &report.summary;
            assert!(report.succeeded(), "{kind}: {s}");
            assert_eq!(
                (s.allocations, s.frees, s.failures_in_log),
                (32, 31, 1),
                "{kind}"
            );
            assert_eq!(s.peaks.in_use, 138_420_836, "{kind}");
            assert_eq!(s.peak_line, Some(12), "{kind}");
            assert_eq!(s.leaked, (1, 16 << 20), "{kind}");
            assert_eq!(report.panel.in_use.len(), 63);
            assert_eq!(report.panel.reserved, report.replay.reserved);
            assert_eq!(report.panel.capacity, Some(4 << 30));
            // As on a GPU: no maximum, the 4 GiB of simulated memory bound the pool.
            let (expected_reserved, expected_growths): (u64, Option<u64>) = match kind {
                // The request, then at least doubling: 5 chunks, 256 MiB for the peak's
                // 132 MiB.
                ResourceKind::Pool => (256 << 20, Some(5)),
                // Half of the free memory, as on a GPU.
                ResourceKind::Arena => (2 << 30, None),
                // The bins' first chunks (128 blocks each of 256 KiB..4 MiB: 32, 64, 128, 256,
                // 512 MiB, each a growth of the pool) make 992 MiB; the first request above
                // 4 MiB doubles that.
                ResourceKind::Binning => (1984 << 20, Some(6)),
                // Blocks of 32 MiB (the largest request), 8 per chunk; the peak holds 4 + 2 +
                // 5 = 11 blocks, so two chunks.
                ResourceKind::Fixed => (512 << 20, None),
                // Mapped as needed, in 2 MiB granules, each growth at least what is mapped
                // (the default): the peak's 132 MiB and the holes between live blocks take
                // the mapping past 128 MiB, to 256.
                ResourceKind::Vmm => (256 << 20, Some(5)),
                _ => unreachable!(),
            };
            assert_eq!(s.peaks.reserved, expected_reserved, "{kind}");
            assert_eq!(s.growths, expected_growths, "{kind}");
            assert_eq!(
                s.to_string().contains("growths"),
                expected_growths.is_some(),
                "{kind}: {s}"
            );
            assert!(
                (s.reserved_to_live() - expected_reserved as f64 / 138_420_836.0).abs() < 1e-9,
                "{kind}: {s}"
            );
            // Everything freed: the pool serves its largest chunk (or grows), the VMM pool and
            // the arena all of the simulated memory at once.
            let (largest, limit) = s.largest_after.expect("probed");
            assert_eq!(limit, 4 << 30, "{kind}");
            if kind == ResourceKind::Vmm {
                assert_eq!(largest, 4 << 30, "{kind}: {s}");
            }
            assert!(largest > 0, "{kind}: {s}");
            let text = s.to_string();
            assert!(text.contains("largest allocation after"), "{text}");
            assert!(text.contains("peak reserved / peak in use"), "{text}");
            // Every resource, the VMM pool included, held at the peak what it held at most
            // (its growth maps ahead what it later needs).
            let at_peak = expected_reserved;
            assert_eq!(s.peaks.reserved_at_peak, at_peak, "{kind}");
            let fragmentation = 1.0 - 138_420_836.0 / at_peak as f64;
            assert!(
                (s.peaks.fragmentation - fragmentation).abs() < 1e-9,
                "{kind}: {s}"
            );
        }
    }

    #[test]
    fn a_resource_that_cannot_be_built_is_an_error() {
        let workload = crate::load(SAMPLE.as_bytes()).unwrap();
        let e = replay_log(
            "sample",
            &workload,
            ResourceKind::Cuda,
            Memory::Simulated(1 << 30),
            &AtomicUsize::new(0),
        )
        .unwrap_err();
        assert!(
            matches!(e, RunError::Build(BuildError::CannotSimulate(_))),
            "{e}"
        );
    }
}
