//! The sample log replayed on the GPU against every resource, as `rmm-replay --resource R`
//! replays it (each stream of the log a real stream, one replay thread per logged thread), and
//! over simulated memory with a GPU present (where the arena records events and synchronizes
//! the device around fake addresses). Without a GPU every trial reports itself ignored, with
//! the reason.
//!
//! The sample travels inside the binary, so the trials run from a GPU bundle anywhere.

use std::sync::atomic::{AtomicUsize, Ordering};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use rmm::mr::{resource_cast, PoolMemoryResource, SharedResource, StatisticsResourceAdaptor};
use rmm::sys::DeviceCapabilities;
use rmm_replay::target::{self, DeviceStreams, Memory, ResourceKind};
use rmm_replay::{load, replay_log, Report, Workload};
use rmm_sys::testing::{ensure, gpu_outcome as gpu};

const SAMPLE: &str = include_str!("../samples/sample.csv");

/// Hand-counted from the sample (see tests/cli.rs).
const PEAK_IN_USE: u64 = 138_420_836;
const PEAK_LINE: usize = 12;
const STEPS: usize = 63;

fn sample() -> Result<Workload, Failed> {
    load(SAMPLE.as_bytes()).map_err(|e| format!("the sample: {e}").into())
}

fn check_report(kind: ResourceKind, report: &Report) -> Result<(), Failed> {
    let s = &report.summary;
    ensure(
        report.succeeded(),
        format!("{kind}: the sample replays: {s}"),
    )?;
    ensure(
        report.replay.steps_run() == STEPS && s.allocations == 32 && s.frees == 31,
        format!("{kind}: every step ran: {s}"),
    )?;
    ensure(
        s.failures_in_log == 1,
        format!("{kind}: one failure row: {s}"),
    )?;
    ensure(
        s.peaks.in_use == PEAK_IN_USE && s.peak_line == Some(PEAK_LINE),
        format!("{kind}: peak in use: {s}"),
    )?;
    ensure(
        s.peaks.reserved_at_peak >= s.peaks.in_use && s.peaks.reserved >= s.peaks.reserved_at_peak,
        format!("{kind}: the resource reserved at least what was in use: {s}"),
    )?;
    ensure(
        (0.0..1.0).contains(&s.peaks.fragmentation),
        format!("{kind}: fragmentation is a share: {s}"),
    )
}

fn replays_the_sample_on(kind: ResourceKind) -> Result<Completion, Failed> {
    if kind == ResourceKind::Async
        && !DeviceCapabilities::probe(rmm::sys::current_device()?)?.memory_pools_supported
    {
        return Ok(Completion::ignored_with(
            "no stream-ordered allocation (memory pools)",
        ));
    }
    if kind == ResourceKind::Vmm && !rmm::sys::vmm::vmm_supported(rmm::sys::current_device()?)? {
        return Ok(Completion::ignored_with(
            "no virtual memory management on this device",
        ));
    }
    let workload = sample()?;
    let streams = DeviceStreams::new(&workload)?;
    ensure(
        streams.created() == 1,
        "the sample's one ordinary stream gets a stream of its own",
    )?;
    drop(streams);
    let progress = AtomicUsize::new(0);
    let report = replay_log("sample.csv", &workload, kind, Memory::Device, &progress)?;
    check_report(kind, &report)?;
    ensure(
        progress.load(Ordering::Relaxed) == STEPS,
        "progress counts every step",
    )?;
    if matches!(kind, ResourceKind::Cuda | ResourceKind::Managed) {
        ensure(
            report.summary.peaks.reserved == PEAK_IN_USE
                && report.summary.peaks.fragmentation == 0.0,
            format!("{kind} reserves what is in use: {}", report.summary),
        )?;
    }
    Ok(Completion::Completed)
}

/// The resource keeps nothing allocated once the replay freed the log's leak.
fn the_pool_is_empty_after_a_replay() -> Result<Completion, Failed> {
    let workload = sample()?;
    let t = target::build(ResourceKind::Pool, Memory::Device, &workload)?;
    let streams = DeviceStreams::new(&workload)?;
    let r = rmm_replay::replay(
        &workload,
        &*t.resource,
        &streams.views(),
        &|| t.reserved(),
        &AtomicUsize::new(0),
    )?;
    ensure(
        r.failure.is_none() && r.cleanup_error.is_none(),
        format!("{r:?}"),
    )?;
    // The pool's upstream counts its growths (the summary's `growths` line).
    let pool = resource_cast::<PoolMemoryResource<StatisticsResourceAdaptor<SharedResource>>>(
        &*t.resource,
    )
    .ok_or("the pool target is a PoolMemoryResource over a counted SharedResource")?;
    ensure(
        pool.outstanding_allocations() == 0,
        format!("{} allocations outstanding", pool.outstanding_allocations()),
    )?;
    ensure(
        r.reserved.last().copied() == Some(pool.pool_size() as u64),
        "the last sample is the pool's size",
    )?;
    Ok(Completion::Completed)
}

/// Simulated memory with a GPU present: the resources take their GPU paths (events,
/// device synchronization in the arena's defragmentation) around addresses that are only
/// numbers, and still nothing touches them.
fn replays_the_sample_over_simulated_memory_with_a_gpu_present() -> Result<Completion, Failed> {
    let workload = sample()?;
    for kind in [
        ResourceKind::Pool,
        ResourceKind::Arena,
        ResourceKind::Binning,
        ResourceKind::Fixed,
    ] {
        let report = replay_log(
            "sample.csv",
            &workload,
            kind,
            Memory::Simulated(4 << 30),
            &AtomicUsize::new(0),
        )?;
        check_report(kind, &report)?;
    }
    // Too small (an arena of half the simulated 200 MiB, as on a GPU): the arena defragments
    // (synchronizing the device) before it gives up.
    let report = replay_log(
        "sample.csv",
        &workload,
        ResourceKind::Arena,
        Memory::Simulated(200 << 20),
        &AtomicUsize::new(0),
    )?;
    let failure = report
        .summary
        .failure
        .as_ref()
        .ok_or("the sample does not fit in a 100 MiB arena (of 200 MiB simulated)")?;
    ensure(
        failure.at.line == 8 && failure.error.is_out_of_memory(),
        format!("ran out at line 8: {}", report.summary),
    )?;
    ensure(
        report.replay.cleanup_error.is_none(),
        "what was live was given back",
    )?;
    Ok(Completion::Completed)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials: Vec<Trial> = ResourceKind::ALL
        .into_iter()
        .map(|kind| {
            gpu(
                format!("replays_the_sample_on_{}", kind.name()),
                move || replays_the_sample_on(kind),
            )
        })
        .collect();
    trials.push(gpu(
        "the_pool_is_empty_after_a_replay",
        the_pool_is_empty_after_a_replay,
    ));
    trials.push(gpu(
        "replays_the_sample_over_simulated_memory_with_a_gpu_present",
        replays_the_sample_over_simulated_memory_with_a_gpu_present,
    ));
    libtest_mimic::run(&args, trials).exit();
}
