//! The CI slices of the fuzz targets: a few dozen random inputs per checker (raw bytes and
//! structured operation sequences), every seed of the committed corpora, and checks that the
//! checkers do fail on what they must reject.

use std::path::PathBuf;

use proptest::prelude::*;
use rmm_checks::ops::{self, BinResource, Kind, Op, Setup, Stream, WrongFree};
use rmm_checks::{byte_size, check_target, csv_log, TARGETS};

/// Cases per property in CI; `PROPTEST_CASES` overrides it for a longer run.
const CASES: u32 = 32;

fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = CASES;
    }
    // Inputs are bytes: a failure prints them, and they replay as a corpus file.
    config.failure_persistence = None;
    config
}

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Every committed seed of every target passes its checker (so a crash artifact added to a
/// corpus becomes a regression test of CI).
#[test]
fn committed_corpora_pass() {
    for target in TARGETS {
        let dir = corpus_dir(target);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect::<Vec<_>>();
        assert!(!entries.is_empty(), "{}: no seeds", dir.display());
        for path in entries {
            let data = std::fs::read(&path).unwrap();
            if let Err(e) = check_target(target, &data) {
                panic!("{}: {e}", path.display());
            }
        }
    }
}

#[test]
fn unknown_targets_are_errors() {
    assert!(check_target("no_such_target", b"").is_err());
}

fn stream() -> impl Strategy<Value = Stream> {
    prop_oneof![Just(Stream::Legacy), Just(Stream::PerThread)]
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 1usize..=1024,
        3 => 1usize..=64 * 1024,
        2 => 1usize..=(1 << 20) + 4096,
        1 => 1usize..=4 << 20,
        1 => Just(0usize),
        1 => (0usize..4096).prop_map(|k| usize::MAX - k),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), 1u32..=8, stream()).prop_map(|(bytes, a, stream)| Op::Allocate {
            bytes,
            alignment: 1 << a,
            stream,
        }),
        6 => (any::<u16>(), stream()).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => (any::<u16>(), stream()).prop_map(|(pick, stream)| Op::WrongFree {
            kind: WrongFree::DoubleFree { pick },
            stream,
        }),
        1 => (any::<u16>(), any::<u8>(), stream()).prop_map(|(pick, how, stream)| {
            Op::WrongFree { kind: WrongFree::WrongSize { pick, how }, stream }
        }),
        1 => (any::<u16>(), any::<u8>(), stream()).prop_map(|(pick, how, stream)| {
            Op::WrongFree { kind: WrongFree::UnknownPointer { pick, how }, stream }
        }),
        1 => stream().prop_map(|stream| Op::FreeNull { stream }),
        1 => (1u8..=8).prop_map(|count| Op::FailUpstream { count }),
        1 => Just(Op::Maintain),
        1 => add_bin(),
    ]
}

fn add_bin() -> impl Strategy<Value = Op> {
    (
        1..=ops::MAX_ADDED_BIN,
        prop_oneof![
            Just(BinResource::Fixed),
            Just(BinResource::Upstream),
            Just(BinResource::FixedSize)
        ],
    )
        .prop_map(|(size, resource)| Op::AddBin { size, resource })
}

/// Operations of a binning resource that keeps getting bins: small sizes (most served by bins
/// that come and go), frees and wrong frees, and about as many bins added as the rest.
fn late_bin_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..=40 * 1024, stream()).prop_map(|(bytes, stream)| Op::Allocate {
            bytes,
            alignment: 256,
            stream,
        }),
        3 => (any::<u16>(), stream()).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => (any::<u16>(), any::<u8>(), stream()).prop_map(|(pick, how, stream)| {
            Op::WrongFree { kind: WrongFree::WrongSize { pick, how }, stream }
        }),
        1 => (any::<u16>(), stream()).prop_map(|(pick, stream)| Op::WrongFree {
            kind: WrongFree::DoubleFree { pick },
            stream,
        }),
        1 => (any::<u16>(), any::<u8>(), stream()).prop_map(|(pick, how, stream)| {
            Op::WrongFree { kind: WrongFree::UnknownPointer { pick, how }, stream }
        }),
        8 => add_bin(),
    ]
}

/// Two setup bytes and a structured sequence, as the bytes a fuzz target would get.
fn script() -> impl Strategy<Value = Vec<u8>> {
    (any::<[u8; 2]>(), proptest::collection::vec(op(), 0..160)).prop_map(|(setup, ops)| {
        let mut data = setup.to_vec();
        data.extend(ops::encode_ops(&ops).expect("the strategy makes encodable operations"));
        data
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn encoding_round_trips(ops in proptest::collection::vec(op(), 0..64)) {
        let data = ops::encode_ops(&ops).unwrap();
        let back = ops::decode_ops(&mut rmm_checks::input::Bytes::new(&data));
        prop_assert_eq!(back, ops);
    }

    #[test]
    fn pool_ops(data in script()) {
        ops::check(Kind::Pool, &data).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn arena_ops(data in script()) {
        ops::check(Kind::Arena, &data).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fixed_size_ops(data in script()) {
        ops::check(Kind::FixedSize, &data).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn binning_ops(data in script()) {
        ops::check(Kind::Binning, &data).map_err(TestCaseError::fail)?;
    }

    /// Bins added between any two operations, well past the 64 the lock-free routes hold.
    #[test]
    fn binning_ops_with_late_bins(
        setup in any::<[u8; 2]>(),
        ops in proptest::collection::vec(late_bin_op(), 100..400),
    ) {
        let mut data = setup.to_vec();
        data.extend(ops::encode_ops(&ops).expect("encodable"));
        ops::check(Kind::Binning, &data).map_err(TestCaseError::fail)?;
    }

    /// Raw bytes, as the fuzzer starts from.
    #[test]
    fn raw_bytes_ops(kind in prop_oneof![
        Just(Kind::Pool), Just(Kind::Arena), Just(Kind::FixedSize), Just(Kind::Binning)
    ], data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        ops::check(kind, &data).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn csv_parser_raw(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        csv_log::check(&data).map_err(TestCaseError::fail)?;
    }

    /// Logs of near-valid rows: every field a valid value, a near miss or junk.
    #[test]
    fn csv_parser_rows(rows in proptest::collection::vec(proptest::collection::vec(
        prop_oneof![
            Just("140210031454016".to_owned()),
            Just("14:03:27.512345".to_owned()),
            Just("14:03:27:512345".to_owned()),
            Just("24:00:00.000000".to_owned()),
            Just("allocate".to_owned()),
            Just("allocate failure".to_owned()),
            Just("free".to_owned()),
            Just("Free".to_owned()),
            Just("(nil)".to_owned()),
            Just("0x7f3a1c000000".to_owned()),
            Just("0X7F".to_owned()),
            Just("0x".to_owned()),
            Just("18446744073709551616".to_owned()),
            Just(" 100 ".to_owned()),
            "[0-9a-fx ]{0,20}",
        ],
        6..=7,
    ), 0..8), header in prop_oneof![
        Just("Thread,Time,Action,Pointer,Size,Stream".to_owned()),
        Just("\u{feff}Stream,Size,Pointer,Action,Time,Thread,Extra".to_owned()),
        Just("Thread,Time,Action,Pointer,Size".to_owned()),
        Just("Thread,Thread,Time,Action,Pointer,Size,Stream".to_owned()),
    ], crlf in any::<bool>()) {
        let end = if crlf { "\r\n" } else { "\n" };
        let mut text = header + end;
        for row in rows {
            text.push_str(&row.join(","));
            text.push_str(end);
        }
        csv_log::check(text.as_bytes()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn byte_size_raw(data in proptest::collection::vec(any::<u8>(), 0..64)) {
        byte_size::check_bytes(&data).map_err(TestCaseError::fail)?;
    }

    /// Numbers with long fractions and every unit.
    #[test]
    fn byte_size_forms(
        space in "[ \t]{0,2}",
        whole in "[0-9]{0,24}",
        fraction in proptest::option::of("[0-9]{0,48}"),
        gap in "[ ]{0,1}",
        unit in prop_oneof![
            Just(""), Just("b"), Just("k"), Just("KiB"), Just("m"), Just("MIB"), Just("g"),
            Just("GiB"), Just("t"), Just("TiB"), Just("kb"), Just("MB"), Just("gB"),
            Just("TB"), Just("x"), Just("KiBB"),
        ],
    ) {
        let s = match fraction {
            Some(f) => format!("{space}{whole}.{f}{gap}{unit}{space}"),
            None => format!("{space}{whole}{gap}{unit}{space}"),
        };
        byte_size::check(&s).map_err(TestCaseError::fail)?;
    }
}

/// A hand-written sequence touches every kind of operation on every resource (so the random
/// slices above are not the only evidence, and the counters prove the checker did something).
#[test]
fn a_scripted_sequence_exercises_every_operation() {
    let pt = Stream::PerThread;
    let lg = Stream::Legacy;
    let alloc = |bytes, stream| Op::Allocate {
        bytes,
        alignment: 256,
        stream,
    };
    let script = [
        alloc(100, lg),
        alloc(3000, lg),
        alloc(300_000, pt),
        alloc(2 << 20, lg),
        alloc(0, lg),
        alloc(usize::MAX, lg),
        Op::WrongFree {
            kind: WrongFree::WrongSize { pick: 1, how: 0 },
            stream: lg,
        },
        Op::WrongFree {
            kind: WrongFree::UnknownPointer { pick: 0, how: 0 },
            stream: lg,
        },
        Op::WrongFree {
            kind: WrongFree::UnknownPointer { pick: 2, how: 3 },
            stream: pt,
        },
        Op::Free {
            pick: 0,
            stream: lg,
        },
        Op::WrongFree {
            kind: WrongFree::DoubleFree { pick: 0 },
            stream: lg,
        },
        Op::FreeNull { stream: pt },
        Op::FailUpstream { count: 1 },
        alloc(50, lg),
        Op::Maintain,
        Op::Free {
            pick: 1,
            stream: pt,
        },
    ];
    let setups = [
        Setup::Pool {
            initial: 1 << 20,
            maximum: None,
        },
        Setup::Arena {
            size: 8 << 20,
            size_classes: false,
        },
        Setup::Arena {
            size: 8 << 20,
            size_classes: true,
        },
        Setup::FixedSize {
            block_size: 4 << 20,
            blocks: 2,
        },
        Setup::Binning {
            min_exponent: 8,
            max_exponent: 12,
            extra_bin: Some(200_000),
        },
    ];
    for setup in setups {
        let stats = ops::check_ops(setup, &script).unwrap_or_else(|e| panic!("{e}"));
        assert!(stats.allocations >= 4, "{setup:?}: {stats}");
        assert!(stats.wrong_frees >= 3, "{setup:?}: {stats}");
        assert!(stats.out_of_memory >= 1, "{setup:?}: {stats}");
        assert_eq!(stats.frees, stats.allocations, "{setup:?}: {stats}");
    }
}

/// The binning setup of bins 256 B to 1 KiB and no extra bin.
const SMALL_BINS: Setup = Setup::Binning {
    min_exponent: 8,
    max_exponent: 10,
    extra_bin: None,
};

/// A block of 600 bytes comes from the 1 KiB bin; a bin of 768 bytes added afterwards, of
/// either kind, must not receive its free (issue 27: the free reached the new bin's resource).
#[test]
fn a_bin_added_over_a_live_block_leaves_its_free_to_its_own_bin() {
    for resource in [
        BinResource::Fixed,
        BinResource::Upstream,
        BinResource::FixedSize,
    ] {
        let script = [
            Op::Allocate {
                bytes: 600,
                alignment: 256,
                stream: Stream::Legacy,
            },
            Op::AddBin {
                size: 768,
                resource,
            },
            Op::Free {
                pick: 0,
                stream: Stream::Legacy,
            },
        ];
        if let Err(e) = ops::check_ops(SMALL_BINS, &script) {
            panic!("{resource:?}: {e}");
        }
    }
}

/// 100 bins added one by one between allocations and frees, past 64: every block allocated
/// before, between and after still frees to its own bin.
#[test]
fn a_hundred_late_bins_keep_every_free_with_its_bin() {
    let mut script = Vec::new();
    for i in 0..100usize {
        script.push(Op::Allocate {
            bytes: 200 + 300 * i,
            alignment: 256,
            stream: if i % 2 == 0 {
                Stream::Legacy
            } else {
                Stream::PerThread
            },
        });
        script.push(Op::AddBin {
            size: 256 * (100 - i) + 10,
            resource: match i % 3 {
                0 => BinResource::Fixed,
                1 => BinResource::FixedSize,
                _ => BinResource::Upstream,
            },
        });
        if i % 4 == 3 {
            script.push(Op::Free {
                pick: i as u16,
                stream: Stream::Legacy,
            });
        }
    }
    let stats = ops::check_ops(SMALL_BINS, &script).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stats.bins_added + stats.bins_refused, 100, "{stats}");
    assert!(stats.bins_added > 64, "{stats}");
    // Per-thread-stream allocations need a device (none here): every block made is freed.
    assert!(stats.allocations >= 50, "{stats}");
    assert_eq!(stats.frees, stats.allocations, "{stats}");
}

/// Threads allocate, write, check and free while another adds bins past the routes' 64 (fixed
/// ones, the upstream itself, fixed-size resources): every free of a live block succeeds, no two
/// live blocks overlap (each block's bytes are checked before its free), and once the resource
/// is dropped the upstream holds nothing.
#[test]
fn bins_added_while_threads_allocate_and_free() {
    use rmm_mr::testing::HostMockResource;
    use rmm_mr::{
        shared, BinningMemoryResource, BinningOptions, DeviceMemoryResource,
        FixedSizeMemoryResource, FixedSizeOptions, MrError,
    };
    use std::sync::atomic::{AtomicBool, Ordering};

    const WORKERS: usize = 3;
    const ROUNDS: usize = 300;
    let mock = HostMockResource::new();
    let binning = BinningMemoryResource::with_options(
        mock.clone(),
        BinningOptions::new()
            .min_size_exponent(8)
            .max_size_exponent(10),
    )
    .unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let adder = s.spawn(|| {
            let (mut added, mut refused) = (0, 0);
            for i in 0..150usize {
                let size = 256 * (i + 4) + (i * 37) % 200;
                let resource = match i % 3 {
                    0 | 1 => None,
                    _ => Some(shared(
                        FixedSizeMemoryResource::with_options(
                            mock.clone(),
                            FixedSizeOptions::new()
                                .block_size(size)
                                .blocks_to_preallocate(2),
                        )
                        .unwrap(),
                    )),
                };
                let some = resource.is_some();
                match binning.add_bin(size, resource) {
                    Ok(()) => added += 1,
                    Err(MrError::InvalidArgument(_)) if some => refused += 1,
                    Err(e) => panic!("add_bin({size}) failed: {e:?}"),
                }
                std::thread::yield_now();
            }
            done.store(true, Ordering::Release);
            (added, refused)
        });
        for w in 0..WORKERS {
            let binning = &binning;
            let done = &done;
            s.spawn(move || {
                let stream = rmm_stream::CudaStreamView::legacy();
                let mut live: Vec<(rmm_sys::DevicePtr, usize, u8)> = Vec::new();
                let mut round = 0usize;
                while round < ROUNDS || !done.load(Ordering::Acquire) {
                    round += 1;
                    let bytes = 1 + (round * 7919 + w * 104_729) % (24 * 1024);
                    let tag = (round as u8) ^ (w as u8 * 85);
                    let p = binning.allocate(stream, bytes, 256).unwrap();
                    let h = p.as_host_ptr::<u8>();
                    // SAFETY: `bytes` bytes of host memory (the mock's) just handed out.
                    unsafe {
                        h.write(tag);
                        h.add(bytes - 1).write(tag);
                    }
                    live.push((p, bytes, tag));
                    if round % 3 != 0 {
                        let (p, bytes, tag) = live.swap_remove(round % live.len());
                        let h = p.as_host_ptr::<u8>();
                        // SAFETY: a live block of `bytes` bytes, written at allocation.
                        let (a, b) = unsafe { (h.read(), h.add(bytes - 1).read()) };
                        assert_eq!((a, b), (tag, tag), "block {p} ({bytes} B) overwritten");
                        // SAFETY: allocated here with this size, freed once.
                        unsafe { binning.deallocate(stream, p, bytes, 256) }
                            .unwrap_or_else(|e| panic!("free of {p} ({bytes} B): {e}"));
                    }
                }
                for (p, bytes, _) in live {
                    // SAFETY: as above.
                    unsafe { binning.deallocate(stream, p, bytes, 256) }
                        .unwrap_or_else(|e| panic!("final free of {p} ({bytes} B): {e}"));
                }
            });
        }
        let (added, refused) = adder.join().unwrap();
        assert_eq!(added + refused, 150);
        assert!(added >= 100, "{added} bins added, {refused} refused");
    });
    assert!(binning.bin_sizes().len() > 64, "{:?}", binning.bin_sizes());
    drop(binning);
    assert_eq!(
        (mock.live_allocations(), mock.live_bytes()),
        (0, 0),
        "the upstream holds memory after the resource was dropped"
    );
}
