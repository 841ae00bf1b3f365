use super::*;
use crate::binning::table::{rounded_bin_size, BinTable};
use proptest::prelude::*;

/// An `admit` that accepts every bin.
fn admit_all<B>(_: &B, _: &mut dyn Iterator<Item = Option<&B>>) -> Result<(), ()> {
    Ok(())
}

fn route<B: Copy>(r: &BinRoutes<B>, bytes: usize) -> Option<(usize, B)> {
    r.current().route(bytes).map(|(s, b)| (s, *b))
}

/// The distinct routes a free of `bytes` may take, in order (`None`: the upstream).
fn candidates<B: Copy + PartialEq>(r: &BinRoutes<B>, bytes: usize) -> Vec<Option<B>> {
    let mut out = Vec::new();
    for c in r.candidates(r.current(), bytes).map(|c| c.copied()) {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

#[test]
fn routes_to_the_smallest_fitting_bin() {
    let r = BinRoutes::new();
    assert!(r.is_empty());
    assert_eq!(route(&r, 0), None);
    assert_eq!(r.insert(1 << 20, "1M", admit_all), Ok(true));
    assert_eq!(r.insert(1 << 18, "256K", admit_all), Ok(true));
    assert_eq!(r.insert(1 << 22, "4M", admit_all), Ok(true));
    assert_eq!(r.insert(1 << 18, "dup", admit_all), Ok(false));
    assert_eq!(r.len(), 3);
    assert_eq!(route(&r, 0), Some((1 << 18, "256K")));
    assert_eq!(route(&r, 1 << 18), Some((1 << 18, "256K")));
    assert_eq!(route(&r, (1 << 18) + 1), Some((1 << 20, "1M")));
    assert_eq!(route(&r, 1 << 22), Some((1 << 22, "4M")));
    assert_eq!(route(&r, (1 << 22) + 1), None);
    assert_eq!(
        r.bins().map(|(s, p)| (s, *p)).collect::<Vec<_>>(),
        [(1 << 18, "256K"), (1 << 20, "1M"), (1 << 22, "4M")]
    );
    assert!(format!("{r:?}").contains("256K"));
    // Moved, the routes still route.
    let moved = Box::new(r);
    assert_eq!(route(&moved, 1 << 22), Some((1 << 22, "4M")));
    assert_eq!(route(&moved, 1), Some((1 << 18, "256K")));
}

#[test]
fn size_classes_split_at_powers_of_two() {
    assert_eq!(
        (class_of(0), class_of(1), class_of(2), class_of(3)),
        (0, 0, 1, 2)
    );
    for k in 1..usize::BITS as usize {
        assert_eq!(class_of(1 << k), k);
        assert_eq!(class_of((1 << k) + 1), k + 1);
    }
    assert_eq!(class_of(usize::MAX), CLASSES - 1);
}

#[test]
fn class_bits_cover_exactly_the_classes_of_a_range() {
    assert_eq!(class_bit(0), 1);
    assert_eq!(class_bit(2), 1);
    assert_eq!(class_bit(3), 2);
    assert_eq!(class_bit(usize::MAX), 1 << 62);
    assert_eq!(class_bits(0, 0), 1);
    assert_eq!(class_bits(257, 768), class_bit(300) | class_bit(768));
    assert_eq!(class_bits(1025, 4096), class_bit(2048) | class_bit(4096));
    for (lo, hi) in [(0usize, 1usize << 20), (3, 3), (1000, 1 << 40)] {
        let bits = class_bits(lo, hi);
        assert_eq!(bits & SEALED, 0, "the seal is no class");
        for bytes in [lo, hi, lo + (hi - lo) / 2] {
            assert_ne!(bits & class_bit(bytes), 0, "{bytes} in {lo}..={hi}");
        }
        assert_eq!(bits & class_bit(hi.saturating_mul(4)), 0);
    }
}

#[test]
fn routes_near_powers_of_two_match_the_bin_table() {
    // Bins that share a class, bins on and off powers of two, requests around each.
    let sizes = [
        256usize,
        512,
        768,
        1024,
        1280,
        4096,
        1 << 18,
        3 << 18,
        1 << 22,
    ];
    let routes = BinRoutes::new();
    let mut table = BinTable::new();
    for &s in &sizes {
        routes.insert(s, s, admit_all).unwrap();
        table.add_bin(s, s).unwrap();
    }
    for k in 0..usize::BITS {
        let p = 1usize << k;
        for bytes in [p - 1, p, p + 1, p.saturating_add(255), usize::MAX] {
            assert_eq!(
                route(&routes, bytes),
                table.route(bytes).map(|(s, p)| (*s, *p)),
                "{bytes}"
            );
        }
    }
}

#[test]
fn more_than_64_bins_route_and_the_limit_is_an_error() {
    let r = BinRoutes::new();
    for i in (0..BinRoutes::<usize>::MAX_BINS).rev() {
        assert_eq!(r.insert(256 * (i + 1), i, admit_all), Ok(true));
    }
    assert_eq!(route(&r, 256 * 70 - 3), Some((256 * 70, 69)));
    assert_eq!(route(&r, 1), Some((256, 0)));
    assert_eq!(r.insert(1 << 40, 99, admit_all), Err(InsertError::Full(99)));
    assert_eq!(
        r.insert(256, 7, admit_all),
        Ok(false),
        "an existing size is not a new bin"
    );
    assert_eq!(r.len(), BinRoutes::<usize>::MAX_BINS);
    assert_eq!(route(&r, 1 << 30), None, "the full routes still route");
}

#[test]
fn a_free_sees_the_bin_its_block_came_from_after_a_bin_is_added() {
    let r = BinRoutes::new();
    r.insert(1024, 1024usize, admit_all).unwrap();
    // Nothing allocated: one era, one candidate.
    assert!(r.current().is_only_era());
    // A 600-byte block from the 1 KiB bin, then a 768-byte bin.
    assert_eq!(r.for_allocation(600).route(600).map(|(s, _)| s), Some(1024));
    let mut seen = Vec::new();
    r.insert(768, 768, |_, served| {
        seen.extend(served.map(|b| b.copied()));
        Ok::<_, ()>(())
    })
    .unwrap();
    assert_eq!(seen, [Some(1024)], "admit sees the route of the range");
    assert!(!r.current().is_only_era());
    assert_eq!(route(&r, 600), Some((768, 768)));
    assert_eq!(candidates(&r, 600), [Some(768), Some(1024)]);
    // Sizes whose class was never allocated, or that no bin changed, have one candidate.
    assert_eq!(candidates(&r, 100), [Some(768)]);
    assert_eq!(candidates(&r, 1000), [Some(1024)]);
    assert_eq!(candidates(&r, 5000), [None]);
}

#[test]
fn a_refused_bin_leaves_the_routes_and_the_seal_as_they_were() {
    let r = BinRoutes::new();
    // Memory from the upstream (no bins yet), then a refused bin.
    let _ = r.for_allocation(300);
    assert_eq!(
        r.insert(512, 5, |_, served| {
            assert_eq!(served.map(|b| b.copied()).collect::<Vec<_>>(), [None]);
            Err("no")
        }),
        Err(InsertError::Refused(5, "no"))
    );
    assert!(r.is_empty());
    // Not sealed: allocations mark the version without waiting.
    let v = r.for_allocation(5000);
    assert!(v.allocated(5000) && v.allocated(300));
    assert_eq!(v.allocated.load(Ordering::Relaxed) & SEALED, 0);
}

#[test]
fn admit_sees_only_eras_that_allocated_in_the_range() {
    let r = BinRoutes::<u32>::new();
    r.insert(1024, 1, admit_all).unwrap();
    let _ = r.for_allocation(100);
    r.insert(4096, 4, admit_all).unwrap();
    let _ = r.for_allocation(1500);
    // The 1 KiB era allocated only 100 bytes' class; the 4 KiB era 1500 bytes' (1025..=2048).
    let mut seen = Vec::new();
    r.insert(2048, 2, |_, served| {
        seen.extend(served.map(|b| b.copied()));
        Ok::<_, ()>(())
    })
    .unwrap();
    assert_eq!(seen, [Some(4)], "only the era that allocated 1025..=2048");
    let mut seen = Vec::new();
    r.insert(1 << 20, 9, |_, served| {
        seen.extend(served.map(|b| b.copied()));
        Ok::<_, ()>(())
    })
    .unwrap();
    assert!(
        seen.is_empty(),
        "nothing above 4 KiB was allocated: {seen:?}"
    );
}

#[test]
fn readers_see_bins_appear_while_routing() {
    let r = BinRoutes::new();
    r.insert(1024, 1024usize, admit_all).unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            let r = &r;
            s.spawn(move || {
                for i in 0..20_000usize {
                    let bytes = 1 + i % (1 << 20);
                    let v = r.for_allocation(bytes);
                    if let Some((size, &payload)) = v.route(bytes) {
                        assert!(size >= bytes && payload == size, "{bytes} -> {size}");
                        // The bin it went to stays a candidate for its free.
                        assert!(r
                            .candidates(r.current(), bytes)
                            .any(|c| c == Some(&payload)));
                    } else {
                        assert!(r.candidates(r.current(), bytes).any(|c| c.is_none()));
                    }
                }
            });
        }
        for e in (11..21).rev() {
            r.insert(1 << e, 1 << e, admit_all).unwrap();
        }
    });
    assert_eq!(r.len(), 11);
}

proptest! {
    #[test]
    fn routes_match_the_bin_table(
        sizes in proptest::collection::vec(0usize..1 << 24, 0..20),
        requests in proptest::collection::vec(0usize..1 << 25, 1..40),
    ) {
        let routes = BinRoutes::new();
        let mut table = BinTable::new();
        for &s in &sizes {
            let size = rounded_bin_size(s).unwrap();
            let inserted = table.add_bin(size, s).unwrap();
            prop_assert_eq!(routes.insert(size, s, admit_all), Ok(inserted));
        }
        prop_assert_eq!(
            routes.bins().map(|(s, p)| (s, *p)).collect::<Vec<_>>(),
            table.bins().map(|(s, p)| (*s, *p)).collect::<Vec<_>>()
        );
        for r in requests {
            prop_assert_eq!(route(&routes, r), table.route(r).map(|(s, p)| (*s, *p)));
        }
    }

    /// Allocations and bin insertions interleaved: every allocation's route stays among the
    /// candidates of its free, whatever was added since, and admit saw it when it mattered.
    #[test]
    fn every_block_keeps_its_route_among_the_candidates(
        ops in proptest::collection::vec((any::<bool>(), 0usize..1 << 16), 1..80),
    ) {
        let routes = BinRoutes::new();
        let mut live: Vec<(usize, Option<usize>)> = Vec::new();
        for (add, n) in ops {
            if add {
                let size = rounded_bin_size(n).unwrap();
                let mut served = Vec::new();
                let added = routes.insert(size, size, |_, s| {
                    served.extend(s.map(|b| b.copied()));
                    Ok::<_, ()>(())
                });
                prop_assert!(added.is_ok());
                // Admit saw the route of every live block the new bin's range takes over.
                for &(bytes, went) in live.iter().filter(|_| added == Ok(true)) {
                    if route(&routes, bytes).map(|(s, _)| s) == Some(size) && went != Some(size) {
                        prop_assert!(served.contains(&went), "{bytes} from {went:?}: {served:?}");
                    }
                }
            } else {
                let went = routes.for_allocation(n).route(n).map(|(_, b)| *b);
                live.push((n, went));
            }
            for &(bytes, went) in &live {
                prop_assert!(
                    candidates(&routes, bytes).contains(&went),
                    "{bytes} from {went:?}: {:?}",
                    candidates(&routes, bytes)
                );
            }
        }
    }
}
