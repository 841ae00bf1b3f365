//! The adaptors on a GPU: RMM's conformance suite for every adaptor over a CUDA upstream and a
//! composition, plus RMM's adaptor-specific GPU cases (aligned_mr_tests, logger_tests,
//! prefetch_resource_adaptor_tests, statistics/tracking/failure-callback over cuda,
//! cccl_adaptor_tests' value semantics). Without a GPU those trials are ignored, with the reason;
//! the few cases that need no GPU (the `RMM_LOG_FILE` and `RMM_DEBUG_LOG_FILE` paths) run
//! everywhere.

mod conformance;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use conformance::{alignment_trials, ensure, trials, Subject, GIB, KIB, MIB};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use rmm_mr::testing::HostMockResource;
use rmm_mr::{parse_log, Action, MemoryEvent};
use rmm_mr::{
    AlignedOptions, AlignedResourceAdaptor, ArenaMemoryResource, ArenaOptions,
    BinningMemoryResource, BinningOptions, CudaAsyncMemoryResource, CudaMemoryResource,
    DeviceMemoryResource, FailureCallbackResourceAdaptor, FixedSizeMemoryResource,
    LimitingResourceAdaptor, LoggingOptions, LoggingResourceAdaptor, ManagedMemoryResource,
    MrError, PoolMemoryResource, PrefetchResourceAdaptor, SharedResource,
    StatisticsResourceAdaptor, ThreadSafeResourceAdaptor, TrackingOptions, TrackingResourceAdaptor,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::testing::{caps, done, gpu_outcome as gpu, no_pools};
use rmm_sys::DevicePtr;

// --- helpers ---------------------------------------------------------------------------------

/// Where this run writes its logs; removed at the end.
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("rmm_gpu_adaptors_{}", std::process::id()))
}

/// A fresh file name in the scratch directory.
fn scratch_file(stem: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    scratch_dir().join(format!("{stem}_{}.csv", N.fetch_add(1, Ordering::Relaxed)))
}

/// The log file `RMM_LOG_FILE` points at (set by `main` before any thread starts).
fn env_log_file() -> PathBuf {
    scratch_dir().join("from_env.csv")
}

/// The debug log file `RMM_DEBUG_LOG_FILE` points at (set by `main`).
fn env_debug_log_file() -> PathBuf {
    scratch_dir().join("debug.log")
}

fn arc<R: DeviceMemoryResource>(r: R) -> SharedResource {
    Arc::new(r)
}

fn read_log(path: &Path) -> Result<Vec<MemoryEvent>, Failed> {
    let file =
        std::fs::File::open(path).map_err(|e| Failed::from(format!("{}: {e}", path.display())))?;
    parse_log(std::io::BufReader::new(file)).map_err(|e| Failed::from(e.to_string()))
}

/// RMM's `expect_log_events`: the (action, size, pointer) sequence.
fn expect_events(
    events: &[MemoryEvent],
    expected: &[(Action, usize, DevicePtr)],
) -> Result<(), Failed> {
    let got: Vec<_> = events
        .iter()
        .map(|e| (e.action, e.size, DevicePtr::from_raw(e.pointer)))
        .collect();
    ensure(
        got == expected,
        format!("log events {got:?}, expected {expected:?}"),
    )
}

// --- the conformance subjects ----------------------------------------------------------------

fn subjects() -> Vec<Subject> {
    vec![
        Subject::new("aligned", || {
            Ok(arc(AlignedResourceAdaptor::new(
                CudaMemoryResource::new(),
                256,
            )?))
        }),
        Subject::new("aligned_4096", || {
            Ok(arc(AlignedResourceAdaptor::new(
                CudaMemoryResource::new(),
                4096,
            )?))
        }),
        Subject::new("logging", || {
            Ok(arc(LoggingResourceAdaptor::new(
                CudaMemoryResource::new(),
                scratch_file("conformance"),
            )?))
        }),
        Subject::new("statistics", || {
            Ok(arc(StatisticsResourceAdaptor::new(
                CudaMemoryResource::new(),
            )))
        }),
        Subject::new("tracking", || {
            Ok(arc(TrackingResourceAdaptor::new(CudaMemoryResource::new())))
        }),
        Subject::new("thread_safe", || {
            Ok(arc(ThreadSafeResourceAdaptor::new(
                CudaMemoryResource::new(),
            )))
        }),
        Subject::new("failure_callback", || {
            Ok(arc(FailureCallbackResourceAdaptor::new(
                CudaMemoryResource::new(),
                |_| false,
            )))
        }),
        Subject::new("prefetch", || {
            Ok(arc(PrefetchResourceAdaptor::new(CudaMemoryResource::new())))
        }),
        Subject::new("prefetch_over_managed", || {
            Ok(arc(PrefetchResourceAdaptor::new(
                ManagedMemoryResource::new(),
            )))
        })
        .without_oversize(),
        Subject::new("statistics_over_logging_over_limiting_over_async", || {
            let upstream: SharedResource = arc(CudaAsyncMemoryResource::new()?);
            let limiting = LimitingResourceAdaptor::new(upstream, 4 * GIB);
            let logging = LoggingResourceAdaptor::new(limiting, scratch_file("composition"))?;
            Ok(arc(StatisticsResourceAdaptor::new(logging)))
        })
        .unsupported_when(no_pools),
    ]
}

/// Every adaptor over a sub-allocator (pool, arena, fixed-size, binning over cuda), for the
/// alignment rows only: an adaptor honours what its upstream honours and refuses the rest.
fn alignment_subjects() -> Vec<Subject> {
    fn pool() -> Result<PoolMemoryResource<CudaMemoryResource>, MrError> {
        PoolMemoryResource::new(CudaMemoryResource::new(), 0)
    }
    fn arena() -> Result<ArenaMemoryResource<CudaMemoryResource>, MrError> {
        ArenaMemoryResource::with_options(
            CudaMemoryResource::new(),
            ArenaOptions::new().arena_size(GIB),
        )
    }
    fn fixed() -> Result<FixedSizeMemoryResource<CudaMemoryResource>, MrError> {
        FixedSizeMemoryResource::new(CudaMemoryResource::new())
    }
    fn binning() -> Result<BinningMemoryResource<CudaMemoryResource>, MrError> {
        BinningMemoryResource::with_options(
            CudaMemoryResource::new(),
            BinningOptions::new()
                .min_size_exponent(18)
                .max_size_exponent(22),
        )
    }
    vec![
        Subject::new("aligned_4096_over_pool", || {
            Ok(arc(AlignedResourceAdaptor::new(pool()?, 4096)?))
        }),
        Subject::new("aligned_over_arena", || {
            Ok(arc(AlignedResourceAdaptor::new(arena()?, 256)?))
        }),
        Subject::new("statistics_over_arena", || {
            Ok(arc(StatisticsResourceAdaptor::new(arena()?)))
        }),
        Subject::new("tracking_over_fixed_size", || {
            Ok(arc(TrackingResourceAdaptor::new(fixed()?)))
        }),
        Subject::new("limiting_over_binning", || {
            Ok(arc(LimitingResourceAdaptor::new(binning()?, GIB)))
        }),
        Subject::new("logging_over_pool", || {
            Ok(arc(LoggingResourceAdaptor::new(
                pool()?,
                scratch_file("alignment"),
            )?))
        }),
        Subject::new("thread_safe_over_binning", || {
            Ok(arc(ThreadSafeResourceAdaptor::new(binning()?)))
        }),
        Subject::new("failure_callback_over_fixed_size", || {
            Ok(arc(FailureCallbackResourceAdaptor::new(fixed()?, |_| {
                false
            })))
        }),
        Subject::new("prefetch_over_pool", || {
            Ok(arc(PrefetchResourceAdaptor::new(pool()?)))
        }),
    ]
}

/// Statistics, tracking and limiting adaptors do not count a request their upstream refuses
/// for its alignment.
fn refused_alignments_are_not_counted() -> Result<Completion, Failed> {
    let stats = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    let tracking =
        TrackingResourceAdaptor::new(FixedSizeMemoryResource::new(CudaMemoryResource::new())?);
    let limiting = LimitingResourceAdaptor::new(CudaMemoryResource::new(), GIB);
    let s = CudaStreamView::default();
    for mr in [&stats as &dyn DeviceMemoryResource, &tracking, &limiting] {
        for alignment in [3, 768, 4096, 1 << 40] {
            let r = mr.allocate(s, KIB, alignment);
            ensure(
                matches!(r, Err(MrError::BadAlloc { .. })),
                format!("alignment {alignment}: {r:?}, not BadAlloc"),
            )?;
        }
    }
    let (bytes, allocations) = stats.counters();
    ensure(
        (
            bytes.value,
            bytes.total,
            allocations.value,
            allocations.total,
        ) == (0, 0, 0, 0),
        format!("statistics counted refused requests: {bytes:?} {allocations:?}"),
    )?;
    ensure(
        tracking.allocated_bytes() == 0 && tracking.outstanding_allocations().is_empty(),
        "tracking counted refused requests",
    )?;
    ensure(
        limiting.allocated_bytes() == 0,
        "limiting counted refused requests",
    )?;
    done()
}

// --- cccl_adaptor_tests / adaptor_tests: value semantics over cuda ----------------------------

/// Copies are equal, a fresh instance is not, the upstream is the cuda resource, and memory
/// allocated through one copy is freed through another.
fn value_semantics<A: DeviceMemoryResource + Clone>(
    make: impl Fn() -> Result<A, MrError>,
    upstream: impl Fn(&A) -> &dyn DeviceMemoryResource,
) -> Result<Completion, Failed> {
    let a = make()?;
    let copy = a.clone();
    ensure(a.is_equal(&copy) && copy.is_equal(&a), "copy != original")?;
    ensure(!a.is_equal(&make()?), "fresh instance == original")?;
    ensure(
        upstream(&a).is_equal(&CudaMemoryResource::new()),
        "upstream is not the cuda resource",
    )?;
    let p = copy.allocate_sync(KIB, 256)?;
    ensure(
        !p.is_null() && p.is_aligned(256),
        format!("bad pointer {p}"),
    )?;
    drop(copy);
    // SAFETY: `p` came from a copy of `a`, which shares its state.
    unsafe { a.deallocate_sync(p, KIB, 256)? };
    done()
}

fn value_semantics_trials() -> Vec<Trial> {
    vec![
        gpu("cccl_adaptor::aligned::value_semantics", || {
            value_semantics(
                || AlignedResourceAdaptor::new(CudaMemoryResource::new(), 4096),
                |a| a.upstream(),
            )
        }),
        gpu("cccl_adaptor::logging::value_semantics", || {
            value_semantics(
                || LoggingResourceAdaptor::new(CudaMemoryResource::new(), scratch_file("cccl")),
                |a| a.upstream(),
            )
        }),
        gpu("cccl_adaptor::statistics::value_semantics", || {
            value_semantics(
                || Ok(StatisticsResourceAdaptor::new(CudaMemoryResource::new())),
                |a| a.upstream(),
            )
        }),
        gpu("cccl_adaptor::tracking::value_semantics", || {
            value_semantics(
                || {
                    Ok(TrackingResourceAdaptor::with_options(
                        CudaMemoryResource::new(),
                        TrackingOptions::new().capture_stacks(true),
                    ))
                },
                |a| a.upstream(),
            )
        }),
        gpu("cccl_adaptor::thread_safe::value_semantics", || {
            value_semantics(
                || Ok(ThreadSafeResourceAdaptor::new(CudaMemoryResource::new())),
                |a| a.upstream(),
            )
        }),
        gpu("cccl_adaptor::failure_callback::value_semantics", || {
            value_semantics(
                || {
                    Ok(FailureCallbackResourceAdaptor::new(
                        CudaMemoryResource::new(),
                        |_| false,
                    ))
                },
                |a| a.upstream(),
            )
        }),
        gpu("cccl_adaptor::prefetch::value_semantics", || {
            value_semantics(
                || Ok(PrefetchResourceAdaptor::new(CudaMemoryResource::new())),
                |a| a.upstream(),
            )
        }),
        gpu("cccl_adaptor::limiting::value_semantics", || {
            value_semantics(
                || {
                    Ok(LimitingResourceAdaptor::new(
                        CudaMemoryResource::new(),
                        64 * MIB,
                    ))
                },
                |a| a.upstream(),
            )
        }),
    ]
}

// --- aligned_mr_tests ------------------------------------------------------------------------

fn aligned_rejects_invalid_alignment() -> Result<Completion, Failed> {
    for bad in [255, 768] {
        ensure(
            matches!(
                AlignedResourceAdaptor::new(CudaMemoryResource::new(), bad),
                Err(MrError::InvalidArgument(_))
            ),
            format!("alignment {bad} accepted"),
        )?;
    }
    AlignedResourceAdaptor::new(CudaMemoryResource::new(), 256)?;
    done()
}

fn aligned_real_pointers() -> Result<Completion, Failed> {
    let mr = AlignedResourceAdaptor::with_options(
        CudaMemoryResource::new(),
        AlignedOptions::new(4096).alignment_threshold(0),
    )?;
    let stream = CudaStream::with_default_flags()?;
    let mut live = Vec::new();
    for bytes in [1, 5, 256, 4096, 4097, 65536, 3 * MIB + 17] {
        let p = mr.allocate(stream.view(), bytes, 256)?;
        ensure(
            p.is_aligned(4096),
            format!("{bytes} B: {p} is not 4096-aligned"),
        )?;
        live.push((p, bytes));
    }
    // The whole aligned range is usable.
    for &(p, bytes) in &live {
        // SAFETY: `[p, p + bytes)` is live device memory from `mr`, ordered on `stream`.
        unsafe { rmm_sys::memory::memset_d8_async(p, 0xab, bytes, stream.view().as_raw())? };
    }
    stream.synchronize()?;
    for (p, bytes) in live {
        // SAFETY: `p` came from `mr` with `bytes`; the memset finished.
        unsafe { mr.deallocate(stream.view(), p, bytes, 256)? };
    }
    stream.synchronize()?;
    done()
}

// --- logger_tests ----------------------------------------------------------------------------

fn logger_filename_constructor() -> Result<Completion, Failed> {
    let path = scratch_file("filename");
    let mr = LoggingResourceAdaptor::new(CudaMemoryResource::new(), &path)?;
    let p0 = mr.allocate_sync(100, 256)?;
    let p1 = mr.allocate_sync(42, 256)?;
    // SAFETY: both came from `mr` with these sizes.
    unsafe {
        mr.deallocate_sync(p0, 100, 256)?;
        mr.deallocate_sync(p1, 42, 256)?;
    }
    mr.flush()?;
    expect_events(
        &read_log(&path)?,
        &[
            (Action::Allocate, 100, p0),
            (Action::Allocate, 42, p1),
            (Action::Free, 100, p0),
            (Action::Free, 42, p1),
        ],
    )?;
    done()
}

fn logger_multi_sink() -> Result<Completion, Failed> {
    let (a, b) = (scratch_file("multi_1"), scratch_file("multi_2"));
    let mr = LoggingResourceAdaptor::with_options(
        CudaMemoryResource::new(),
        LoggingOptions::new().file(&a)?.file(&b)?,
    )?;
    let p0 = mr.allocate_sync(100, 256)?;
    let p1 = mr.allocate_sync(42, 256)?;
    // SAFETY: both came from `mr` with these sizes.
    unsafe {
        mr.deallocate_sync(p0, 100, 256)?;
        mr.deallocate_sync(p1, 42, 256)?;
    }
    mr.flush()?;
    let expected = [
        (Action::Allocate, 100, p0),
        (Action::Allocate, 42, p1),
        (Action::Free, 100, p0),
        (Action::Free, 42, p1),
    ];
    expect_events(&read_log(&a)?, &expected)?;
    expect_events(&read_log(&b)?, &expected)?;
    done()
}

fn logger_allocate_failure() -> Result<Completion, Failed> {
    let path = scratch_file("failure");
    let mr = LoggingResourceAdaptor::new(CudaMemoryResource::new(), &path)?;
    let p0 = mr.allocate_sync(99, 256)?;
    // SAFETY: `p0` came from `mr`.
    unsafe { mr.deallocate_sync(p0, 99, 256)? };
    let tib = 1usize << 40;
    ensure(
        mr.allocate_sync(tib, 256)
            .is_err_and(|e| e.is_out_of_memory()),
        "1 TiB did not fail with out-of-memory",
    )?;
    mr.flush()?;
    expect_events(
        &read_log(&path)?,
        &[
            (Action::Allocate, 99, p0),
            (Action::Free, 99, p0),
            (Action::AllocateFailure, tib, DevicePtr::NULL),
        ],
    )?;
    let text = std::fs::read_to_string(&path)?;
    ensure(
        text.contains(",allocate failure,(nil),1099511627776,"),
        "no (nil) failure row",
    )?;
    done()
}

/// `Adaptor.EnvironmentPath` (no GPU needed: the upstream is a host mock).
fn logger_environment_path() -> Result<(), Failed> {
    let mr = LoggingResourceAdaptor::from_env(HostMockResource::new())?;
    let s = CudaStreamView::default();
    let p = mr.allocate(s, 100, 256)?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate(s, p, 100, 256)? };
    mr.flush()?;
    expect_events(
        &read_log(&env_log_file())?,
        &[(Action::Allocate, 100, p), (Action::Free, 100, p)],
    )
}

/// `RMM_DEBUG_LOG_FILE` is honoured (no GPU needed).
fn debug_log_to_env_file() -> Result<(), Failed> {
    rmm_mr::init_debug_logging_with_level(log::LevelFilter::Debug)?;
    log::debug!(target: "rmm_mr::gpu_adaptors", "debug record {}", 42);
    log::debug!(target: "somebody_else", "not ours");
    rmm_mr::flush_debug_log();
    let text = std::fs::read_to_string(env_debug_log_file())?;
    ensure(
        text.contains("][debug ] debug record 42\n"),
        format!("debug log: {text:?}"),
    )?;
    ensure(!text.contains("not ours"), "foreign record logged")
}

// --- statistics / tracking / failure callback over cuda --------------------------------------

fn statistics_peak_allocations() -> Result<Completion, Failed> {
    let mr = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    let s = CudaStreamView::default();
    let unit = 10 * MIB;
    let mut first: Vec<DevicePtr> = (0..10)
        .map(|_| mr.allocate(s, unit, 256))
        .collect::<Result<_, _>>()?;
    let kept = first.split_off(5);
    for p in first {
        // SAFETY: `p` came from `mr` with `unit`.
        unsafe { mr.deallocate(s, p, unit, 256)? };
    }
    let more: Vec<DevicePtr> = (0..10)
        .map(|_| mr.allocate(s, unit, 256))
        .collect::<Result<_, _>>()?;
    let (bytes, allocations) = mr.counters();
    let u = unit as i64;
    ensure(
        (bytes.value, bytes.peak, bytes.total) == (15 * u, 15 * u, 20 * u),
        format!("bytes {bytes:?}"),
    )?;
    ensure(
        (allocations.value, allocations.peak, allocations.total) == (15, 15, 20),
        format!("allocations {allocations:?}"),
    )?;
    for p in kept.into_iter().chain(more) {
        // SAFETY: `p` came from `mr` with `unit`.
        unsafe { mr.deallocate(s, p, unit, 256)? };
    }
    ensure(mr.bytes_counter().value == 0, "bytes left")?;
    done()
}

fn tracking_wrong_frees_over_cuda() -> Result<Completion, Failed> {
    let mr = TrackingResourceAdaptor::with_options(
        CudaMemoryResource::new(),
        TrackingOptions::new().capture_stacks(true),
    );
    let s = CudaStreamView::default();
    let p = mr.allocate(s, MIB, 256)?;
    ensure(mr.allocated_bytes() == MIB, "not tracked")?;
    ensure(mr.report().contains(" : callstack:\n"), "no stack captured")?;
    // SAFETY: `p` came from `mr` with MIB bytes; the wrong size is detected and the allocated
    // size is freed.
    let e = unsafe { mr.deallocate(s, p, MIB + 1, 256) }.unwrap_err();
    ensure(
        matches!(e, MrError::InvalidFree { .. }),
        format!("size mismatch: {e}"),
    )?;
    ensure(mr.allocated_bytes() == 0, "entry left after mismatch")?;
    // SAFETY: a second free of `p` is detected and not forwarded.
    let e = unsafe { mr.deallocate(s, p, MIB, 256) }.unwrap_err();
    ensure(
        matches!(e, MrError::InvalidFree { .. }),
        format!("double free: {e}"),
    )?;
    ensure(mr.error_count() == 2, "errors not recorded")?;
    done()
}

fn failure_callback_retry_once() -> Result<Completion, Failed> {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let mr = FailureCallbackResourceAdaptor::new(CudaMemoryResource::new(), move |_| {
        c.fetch_add(1, Ordering::SeqCst) == 0
    });
    let e = mr
        .allocate(CudaStreamView::default(), 1 << 50, 256)
        .unwrap_err();
    ensure(e.is_out_of_memory(), format!("wrong error {e}"))?;
    ensure(
        calls.load(Ordering::SeqCst) == 2,
        "callback not called twice",
    )?;
    // An unsupported alignment is a bad_alloc from cuda: not retried.
    let e = mr
        .allocate(CudaStreamView::default(), KIB, 4096)
        .unwrap_err();
    ensure(matches!(e, MrError::BadAlloc { .. }), format!("{e}"))?;
    ensure(calls.load(Ordering::SeqCst) == 2, "bad_alloc was retried")?;
    done()
}

// --- prefetch_resource_adaptor_tests ---------------------------------------------------------

/// `cuMemRangeGetAttribute(LAST_PREFETCH_LOCATION)`: a device ordinal, or -2 (invalid) when the
/// range was never prefetched.
fn last_prefetch_location(p: DevicePtr, bytes: usize) -> Result<i32, Failed> {
    Ok(rmm_sys::memory::mem_range_last_prefetch_location(p, bytes)?)
}

fn prefetch_managed_pointer_and_size() -> Result<Completion, Failed> {
    if !caps()?.concurrent_managed_access {
        return Ok(Completion::ignored_with(
            "the device lacks concurrent managed access (prefetch is a no-op)",
        ));
    }
    let device = rmm_sys::current_device()?;
    let stream = CudaStream::with_default_flags()?;
    let bytes = 4 * MIB;

    let plain = ManagedMemoryResource::new();
    let q = plain.allocate(stream.view(), bytes, 256)?;
    stream.synchronize()?;
    let without = last_prefetch_location(q, bytes)?;
    // SAFETY: `q` came from `plain`.
    unsafe { plain.deallocate(stream.view(), q, bytes, 256)? };
    ensure(
        without != device.0,
        format!("prefetched without the adaptor ({without})"),
    )?;

    let mr = PrefetchResourceAdaptor::new(ManagedMemoryResource::new());
    let p = mr.allocate(stream.view(), bytes, 256)?;
    stream.synchronize()?;
    let with = last_prefetch_location(p, bytes)?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate(stream.view(), p, bytes, 256)? };
    ensure(
        with == device.0,
        format!(
            "last prefetch location {with}, expected device {}",
            device.0
        ),
    )?;
    done()
}

fn prefetch_device_memory_is_a_no_op() -> Result<Completion, Failed> {
    let mr = PrefetchResourceAdaptor::new(CudaMemoryResource::new());
    let stream = CudaStream::with_default_flags()?;
    let p = mr.allocate(stream.view(), MIB, 256)?;
    stream.synchronize()?;
    // SAFETY: `p` came from `mr`.
    unsafe { mr.deallocate(stream.view(), p, MIB, 256)? };
    done()
}

fn main() {
    let args = Arguments::from_args();
    let dir = scratch_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        std::process::exit(2);
    }
    // Set while this process is still single-threaded.
    std::env::set_var(rmm_mr::LOG_FILE_ENV, env_log_file());
    std::env::set_var(rmm_mr::DEBUG_LOG_FILE_ENV, env_debug_log_file());

    let mut all: Vec<Trial> = subjects().iter().flat_map(trials).collect();
    all.extend(alignment_subjects().iter().flat_map(alignment_trials));
    all.extend(value_semantics_trials());
    all.extend([
        gpu(
            "aligned::throw_on_invalid_allocation_alignment",
            aligned_rejects_invalid_alignment,
        ),
        gpu("aligned::align_real_pointer", aligned_real_pointers),
        gpu(
            "alignment::refused_requests_are_not_counted",
            refused_alignments_are_not_counted,
        ),
        gpu("logger::filename_constructor", logger_filename_constructor),
        gpu("logger::multi_sink_constructor", logger_multi_sink),
        gpu("logger::allocate_failure", logger_allocate_failure),
        Trial::test("logger::environment_path", logger_environment_path),
        Trial::test("debug_log::honours_env_file", debug_log_to_env_file),
        gpu("statistics::peak_allocations", statistics_peak_allocations),
        gpu(
            "tracking::wrong_frees_over_cuda",
            tracking_wrong_frees_over_cuda,
        ),
        gpu(
            "failure_callback::retry_allocation_once",
            failure_callback_retry_once,
        ),
        gpu(
            "prefetch::managed_pointer_and_size",
            prefetch_managed_pointer_and_size,
        ),
        gpu(
            "prefetch::device_memory_is_a_no_op",
            prefetch_device_memory_is_a_no_op,
        ),
    ]);
    let conclusion = libtest_mimic::run(&args, all);
    let _ = std::fs::remove_dir_all(&dir);
    conclusion.exit();
}
