//! The fault sweeps of the adaptors and the sub-allocators, one test per component (see the
//! harness, [`super`]).

use rmm_sys::align_up;

use super::*;
use crate::resource::resource_cast;
use crate::{
    AlignedResourceAdaptor, BinningMemoryResource, BinningOptions, FailureCallbackOptions,
    FailureCallbackResourceAdaptor, FixedSizeMemoryResource, FixedSizeOptions,
    LimitingResourceAdaptor, LoggingOptions, LoggingResourceAdaptor, PoolMemoryResource,
    PoolOptions, PrefetchResourceAdaptor, StatisticsResourceAdaptor, ThreadSafeResourceAdaptor,
    TrackingResourceAdaptor,
};

fn adaptor<'a>(
    name: &'static str,
    mr: &'a dyn DeviceMemoryResource,
    faulty: &'a Faulty,
    mock: &'a HostMockResource,
) -> Subject<'a> {
    Subject {
        name,
        mr,
        faulty,
        mock,
        state: Box::new(String::new),
        memory: None,
        check: Box::new(move |live| live_count(mock, live)),
        faults: upstream_faults(&FaultKind::ALL),
        max_bytes: 20_000,
        alignments: &[256],
        stream_count: 1,
        mismatch_frees: false,
        maintain: None,
        maintenance: 0,
        writer: None,
    }
}

#[test]
fn aligned() {
    sweep(
        "aligned",
        |f| AlignedResourceAdaptor::new(f.clone(), 4096),
        |mr, faulty, mock| Subject {
            state: Box::new(|| format!("{}", mr.shifted_count())),
            alignments: &[256, 8192],
            ..adaptor("aligned", mr, faulty, mock)
        },
    );
}

#[test]
fn limiting() {
    sweep(
        "limiting",
        |f| Ok(LimitingResourceAdaptor::new(f.clone(), 96 << 10)),
        |mr, faulty, mock| Subject {
            state: Box::new(|| format!("{}", mr.allocated_bytes())),
            check: Box::new(move |live| {
                live_count(mock, live)?;
                let used: usize = live.iter().map(|l| align_up(l.bytes, 256)).sum();
                expect("limiting's bytes", mr.allocated_bytes(), used)
            }),
            ..adaptor("limiting", mr, faulty, mock)
        },
    );
}

#[test]
fn thread_safe() {
    sweep(
        "thread_safe",
        |f| Ok(ThreadSafeResourceAdaptor::new(f.clone())),
        |mr, faulty, mock| adaptor("thread_safe", mr, faulty, mock),
    );
}

#[test]
fn failure_callback() {
    sweep(
        "failure_callback",
        |f| {
            // Retries twice, then gives up, on out-of-memory and bad_alloc.
            let calls = AtomicUsize::new(0);
            Ok(FailureCallbackResourceAdaptor::with_options(
                f.clone(),
                FailureCallbackOptions::new(move |_| {
                    calls.fetch_add(1, Ordering::Relaxed) % 3 != 2
                })
                .filter(|e| matches!(e, MrError::OutOfMemory { .. } | MrError::BadAlloc { .. })),
            ))
        },
        |mr, faulty, mock| adaptor("failure_callback", mr, faulty, mock),
    );
}

#[test]
fn prefetch() {
    sweep(
        "prefetch",
        |f| Ok(PrefetchResourceAdaptor::new(f.clone())),
        |mr, faulty, mock| {
            let mut faults = upstream_faults(&FaultKind::ALL);
            faults.extend(driver_faults(&[DriverCall::CurrentDevice]));
            Subject {
                faults,
                ..adaptor("prefetch", mr, faulty, mock)
            }
        },
    );
}

#[test]
fn statistics() {
    sweep(
        "statistics",
        |f| Ok(StatisticsResourceAdaptor::new(f.clone())),
        |mr, faulty, mock| Subject {
            state: Box::new(|| format!("{:?}", mr.counters())),
            check: Box::new(move |live| {
                live_count(mock, live)?;
                let (bytes, allocations) = mr.counters();
                let sum: usize = live.iter().map(|l| l.bytes).sum();
                expect("counted bytes", bytes.value, sum as i64)?;
                expect("counted allocations", allocations.value, live.len() as i64)
            }),
            ..adaptor("statistics", mr, faulty, mock)
        },
    );
}

#[test]
fn tracking() {
    sweep(
        "tracking",
        |f| Ok(TrackingResourceAdaptor::new(f.clone())),
        |mr, faulty, mock| Subject {
            state: Box::new(|| {
                format!("{:?} {}", mr.registry().outstanding(), mr.allocated_bytes())
            }),
            check: Box::new(move |live| {
                live_count(mock, live)?;
                let mut want: Vec<(u64, usize)> =
                    live.iter().map(|l| (l.ptr.addr(), l.bytes)).collect();
                want.sort_unstable();
                expect("tracked allocations", mr.registry().outstanding(), want)
            }),
            mismatch_frees: true,
            ..adaptor("tracking", mr, faulty, mock)
        },
    );
}

#[test]
fn logging() {
    let switch = PanicSwitch::default();
    sweep(
        "logging",
        |f| {
            LoggingResourceAdaptor::with_options(
                f.clone(),
                LoggingOptions::new().writer(switch.clone()),
            )
        },
        |mr, faulty, mock| {
            let mut faults = upstream_faults(&FaultKind::ALL);
            faults.extend([Injection::WriterPanic; 4]);
            Subject {
                faults,
                writer: Some(switch.clone()),
                ..adaptor("logging", mr, faulty, mock)
            }
        },
    );
}

fn pool_subject<'a>(
    name: &'static str,
    mr: &'a PoolMemoryResource<Faulty>,
    faulty: &'a Faulty,
    mock: &'a HostMockResource,
    stream_count: usize,
) -> Subject<'a> {
    Subject {
        name,
        mr,
        faulty,
        mock,
        state: Box::new(|| format!("{:?}", mr.core_state().memory())),
        memory: Some(Box::new(|| mr.core_state().memory())),
        check: Box::new(move |live| {
            let state = mr.core_state();
            expect("handed out", state.handed_out.0, live.len())?;
            expect("pool size", state.pool_size, mock.live_bytes())?;
            expect("chunks", state.chunks.len(), mock.live_allocations())
        }),
        faults: sub_allocator_faults(),
        max_bytes: 16 << 10,
        alignments: &[256, 256, 4096],
        stream_count,
        mismatch_frees: false,
        maintain: Some(Box::new(|| mr.release_unused().map(|_| ()))),
        maintenance: 4,
        writer: None,
    }
}

#[test]
fn pool() {
    sweep(
        "pool",
        |f| {
            PoolMemoryResource::with_options(
                f.clone(),
                PoolOptions::new(0).maximum_pool_size(128 << 10),
            )
        },
        |mr, faulty, mock| pool_subject("pool", mr, faulty, mock, 4),
    );
}

/// On one stream whole chunks come free (blocks of one chunk spread over several streams'
/// lists never do), so `release_unused` gives them back: its synchronization and its upstream
/// frees fail too.
#[test]
fn pool_one_stream() {
    sweep(
        "pool_one_stream",
        |f| {
            PoolMemoryResource::with_options(
                f.clone(),
                PoolOptions::new(0).maximum_pool_size(128 << 10),
            )
        },
        |mr, faulty, mock| {
            let mut faults = upstream_faults(&[FaultKind::OutOfMemory, FaultKind::Cuda]);
            faults.extend(driver_faults(&[DriverCall::Synchronize]));
            Subject {
                faults,
                maintenance: 16,
                ..pool_subject("pool_one_stream", mr, faulty, mock, 1)
            }
        },
    );
}

#[test]
fn fixed_size() {
    sweep(
        "fixed_size",
        |f| {
            FixedSizeMemoryResource::with_options(
                f.clone(),
                FixedSizeOptions::new()
                    .block_size(1024)
                    .blocks_to_preallocate(2),
            )
        },
        |mr, faulty, mock| Subject {
            name: "fixed_size",
            mr,
            faulty,
            mock,
            state: Box::new(|| format!("{:?}", mr.core_state().memory())),
            memory: Some(Box::new(|| mr.core_state().memory())),
            check: Box::new(move |live| {
                let state = mr.core_state();
                expect("handed out", state.handed_out.0, live.len())?;
                expect("pool size", state.pool_size, mock.live_bytes())
            }),
            faults: sub_allocator_faults(),
            max_bytes: 1024,
            alignments: &[256],
            stream_count: 4,
            mismatch_frees: false,
            maintain: None,
            maintenance: 0,
            writer: None,
        },
    );
}

#[test]
fn binning() {
    type Bin = FixedSizeMemoryResource<Arc<Faulty>>;
    sweep(
        "binning",
        |f| {
            BinningMemoryResource::with_options(
                f.clone(),
                BinningOptions::new()
                    .min_size_exponent(8)
                    .max_size_exponent(10),
            )
        },
        |mr, faulty, mock| {
            let bins = move || {
                mr.bin_sizes()
                    .into_iter()
                    .map(|size| {
                        let bin = mr.bin_for(size).expect("a bin per size");
                        let bin = resource_cast::<Bin>(&*bin).expect("a fixed-size bin");
                        (size, format!("{:?}", bin.core_state().memory()))
                    })
                    .collect::<Vec<_>>()
            };
            Subject {
                name: "binning",
                mr,
                faulty,
                mock,
                state: Box::new(move || format!("{:?}", bins())),
                memory: None,
                check: Box::new(move |live| {
                    let in_bins: usize = mr
                        .bin_sizes()
                        .into_iter()
                        .map(|size| {
                            let bin = mr.bin_for(size).expect("a bin per size");
                            let bin = resource_cast::<Bin>(&*bin).expect("a fixed-size bin");
                            bin.core_state().handed_out.0
                        })
                        .sum();
                    let direct = live.iter().filter(|l| l.bytes > 1024).count();
                    expect("handed out by the bins", in_bins, live.len() - direct)
                }),
                faults: sub_allocator_faults(),
                max_bytes: 4096,
                alignments: &[256],
                stream_count: 4,
                mismatch_frees: false,
                maintain: None,
                maintenance: 0,
                writer: None,
            }
        },
    );
}

/// A bin whose first chunk the upstream refuses is not added, and a binning resource whose
/// construction fails halfway gives back the bins it had made.
#[test]
fn binning_add_bin() {
    for kind in FaultKind::ALL {
        let mock = HostMockResource::new();
        let faulty = FaultyResource::new(mock.clone());
        faulty.fail_allocations(1, 1, kind);
        let e = BinningMemoryResource::with_options(
            faulty.clone(),
            BinningOptions::new()
                .min_size_exponent(8)
                .max_size_exponent(10),
        )
        .unwrap_err();
        assert!(kind.matches(&e), "{kind:?}: {e}");
        assert_eq!(mock.live(), Vec::new(), "{kind:?}: a bin's chunk leaked");

        let mr = BinningMemoryResource::with_options(
            faulty.clone(),
            BinningOptions::new()
                .min_size_exponent(8)
                .max_size_exponent(9),
        )
        .unwrap();
        let before = (mr.bin_sizes(), mock.live());
        faulty.fail_next_allocation(kind);
        assert!(mr.add_bin(1024, None).is_err());
        assert_eq!((mr.bin_sizes(), mock.live()), before, "{kind:?}");
        assert!(
            mr.bin_for(1024).is_none(),
            "{kind:?}: a route to a missing bin"
        );
        mr.add_bin(1024, None).unwrap();
        assert_eq!(mr.bin_sizes(), vec![256, 512, 1024]);
        drop(mr);
        assert_eq!(mock.live(), Vec::new());
    }
}
