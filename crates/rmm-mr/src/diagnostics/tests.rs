//! Snapshots and out-of-memory reports of every sub-allocator over the host mock upstream.

use rmm_stream::CudaStreamView;

use crate::testing::HostMockResource;
use crate::{
    ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions, DeviceMemoryResource,
    FixedSizeMemoryResource, FixedSizeOptions, LimitingResourceAdaptor, MrError,
    PoolMemoryResource, PoolOptions, Snapshot, StatisticsResourceAdaptor, Verdict,
    VmmPoolMemoryResource, VmmPoolOptions,
};

const MIB: usize = 1 << 20;

fn s() -> CudaStreamView<'static> {
    CudaStreamView::legacy()
}

/// Every block lies in its segment, blocks do not overlap, and `allocated` blocks of the
/// given sizes are there; the snapshot writes as a pickle.
fn check(snap: &Snapshot, allocated: &[(u64, usize)]) {
    for seg in &snap.segments {
        let end = seg.address + seg.size as u64;
        let mut cursor = seg.address;
        for b in &seg.blocks {
            assert!(
                b.address >= cursor,
                "blocks overlap or are unsorted: {seg:?}"
            );
            cursor = b.address + b.size as u64;
            assert!(cursor <= end, "block outside its segment: {seg:?}");
        }
    }
    for &(addr, size) in allocated {
        let found = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .find(|b| b.address == addr)
            .unwrap_or_else(|| panic!("no block at {addr:#x}: {snap:?}"));
        assert!(found.allocated && found.size >= size, "{found:?}");
    }
    assert_eq!(snap.allocated_blocks(), allocated.len(), "{snap:?}");
    let mut buf = Vec::new();
    snap.write_pickle(&mut buf).unwrap();
    assert!(!buf.is_empty());
}

fn allocate_some(mr: &dyn DeviceMemoryResource, sizes: &[usize]) -> Vec<(u64, usize)> {
    sizes
        .iter()
        .map(|&n| (mr.allocate(s(), n, 256).unwrap().addr(), n))
        .collect()
}

fn free_all(mr: &dyn DeviceMemoryResource, blocks: &[(u64, usize)]) {
    for &(a, n) in blocks {
        // SAFETY: allocated above with these arguments, unused.
        unsafe { mr.deallocate(s(), rmm_sys::DevicePtr::from_raw(a), n, 256) }.unwrap();
    }
}

#[test]
fn pool_snapshot_has_chunks_and_blocks() {
    let pool = PoolMemoryResource::new(HostMockResource::new(), MIB).unwrap();
    let blocks = allocate_some(&pool, &[1000, 4096, 300_000]);
    let snap = pool.snapshot().unwrap();
    assert_eq!(snap.reserved_bytes(), pool.pool_size());
    check(&snap, &blocks);
    // Free blocks cover the rest: allocated + free = reserved.
    let free: usize = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| !b.allocated)
        .map(|b| b.size)
        .sum();
    assert_eq!(free + snap.allocated_bytes(), snap.reserved_bytes());
    free_all(&pool, &blocks);
    assert_eq!(pool.snapshot().unwrap().allocated_blocks(), 0);
}

#[test]
fn vmm_snapshot_has_chunks_and_blocks() {
    let vmm = VmmPoolMemoryResource::simulated(
        VmmPoolOptions::new(64 * MIB)
            .granularity(2 * MIB)
            .initial_pool_size(2 * MIB),
    )
    .unwrap();
    // Grows past the first chunk: a block spans the mapped chunks.
    let blocks = allocate_some(&vmm, &[MIB, 3 * MIB, 256]);
    check(&vmm.snapshot().unwrap(), &blocks);
    free_all(&vmm, &blocks);
}

#[test]
fn arena_snapshot_has_one_segment() {
    let arena = ArenaMemoryResource::with_options(
        HostMockResource::new(),
        ArenaOptions::new().arena_size(64 * MIB),
    )
    .unwrap();
    let blocks = allocate_some(&arena, &[1000, 4 * MIB, 256]);
    let snap = arena.snapshot().unwrap();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.reserved_bytes(), 64 * MIB);
    check(&snap, &blocks);
    free_all(&arena, &blocks);
}

#[test]
fn fixed_size_snapshot_has_blocks_of_one_size() {
    let fixed = FixedSizeMemoryResource::with_options(
        HostMockResource::new(),
        FixedSizeOptions::new()
            .block_size(4096)
            .blocks_to_preallocate(4),
    )
    .unwrap();
    // Five blocks: a second chunk.
    let blocks = allocate_some(&fixed, &[100, 4096, 256, 1000, 10]);
    let snap = fixed.snapshot().unwrap();
    assert_eq!(snap.segments.len(), 2);
    check(&snap, &blocks);
    let b = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.allocated)
        .unwrap();
    assert_eq!(b.size, 4096);
    free_all(&fixed, &blocks);
}

#[test]
fn binning_snapshot_has_its_bins() {
    let binning = BinningMemoryResource::with_options(
        HostMockResource::new(),
        BinningOptions::new()
            .min_size_exponent(10)
            .max_size_exponent(14),
    )
    .unwrap();
    let blocks = allocate_some(&binning, &[1000, 5000, 16_000]);
    check(&binning.snapshot().unwrap(), &blocks);
    free_all(&binning, &blocks);
}

#[test]
fn adaptors_forward_and_base_resources_refuse() {
    let pool = PoolMemoryResource::new(HostMockResource::new(), MIB).unwrap();
    let stats = StatisticsResourceAdaptor::new(pool.clone());
    let blocks = allocate_some(&stats, &[512]);
    assert_eq!(stats.snapshot().unwrap(), pool.snapshot().unwrap());
    free_all(&stats, &blocks);
    assert!(matches!(
        HostMockResource::new().snapshot(),
        Err(MrError::Unsupported(_))
    ));
}

#[test]
fn pool_report_names_limit_and_free_lists() {
    let pool = PoolMemoryResource::with_options(
        HostMockResource::new(),
        PoolOptions::new(32 * MIB).maximum_pool_size(64 * MIB),
    )
    .unwrap();
    let used = allocate_some(&pool, &[30 * MIB]);
    let e = pool.allocate(s(), 40 * MIB, 256).unwrap_err();
    let r = e.oom_report().expect("a report");
    assert_eq!(r.requested, 40 * MIB);
    assert_eq!(r.reserved, 32 * MIB);
    assert_eq!(r.in_use, 30 * MIB);
    assert_eq!(r.free, 2 * MIB);
    assert_eq!(r.largest_free_block, 2 * MIB);
    assert_eq!(r.limit, Some(64 * MIB));
    assert_eq!(r.free_per_stream, [(0, 2 * MIB)]);
    assert_eq!(r.verdict, Verdict::Limit);
    assert!(e.to_string().contains(
        "requested 40.0 MiB; in use 30.0 MiB of 32.0 MiB reserved (max 64.0 MiB); free 2.0 MiB, \
         largest free block 2.0 MiB; verdict: limit"
    ));
    free_all(&pool, &used);
}

#[test]
fn pool_report_tells_fragmentation_from_an_upstream_refusal() {
    let mock = HostMockResource::new();
    let pool = PoolMemoryResource::new(mock.clone(), 8 * MIB).unwrap();
    // Every other MiB free: 4 MiB free, no 2 MiB block.
    let blocks = allocate_some(&pool, &[MIB; 8]);
    let keep: Vec<_> = blocks.iter().copied().step_by(2).collect();
    let gaps: Vec<_> = blocks.iter().copied().skip(1).step_by(2).collect();
    free_all(&pool, &gaps);
    mock.fail_next_allocations(usize::MAX);
    let r = pool
        .allocate(s(), 2 * MIB, 256)
        .unwrap_err()
        .oom_report()
        .cloned()
        .unwrap();
    assert_eq!((r.free, r.largest_free_block), (4 * MIB, MIB));
    assert_eq!(r.verdict, Verdict::Fragmentation);
    let r = pool
        .allocate(s(), 5 * MIB, 256)
        .unwrap_err()
        .oom_report()
        .cloned()
        .unwrap();
    assert_eq!(r.verdict, Verdict::UpstreamRefused);
    mock.fail_next_allocations(0);
    free_all(&pool, &keep);
}

#[test]
fn arena_limiting_fixed_and_binning_reports() {
    let arena = ArenaMemoryResource::with_options(
        HostMockResource::new(),
        ArenaOptions::new().arena_size(16 * MIB),
    )
    .unwrap();
    let r = arena
        .allocate(s(), 32 * MIB, 256)
        .unwrap_err()
        .oom_report()
        .cloned()
        .unwrap();
    assert_eq!((r.reserved, r.verdict), (16 * MIB, Verdict::Limit));

    let limited = LimitingResourceAdaptor::new(HostMockResource::new(), 4 * MIB);
    let used = allocate_some(&limited, &[3 * MIB]);
    let r = limited
        .allocate(s(), 2 * MIB, 256)
        .unwrap_err()
        .oom_report()
        .cloned()
        .unwrap();
    assert_eq!(
        (r.in_use, r.limit, r.verdict),
        (3 * MIB, Some(4 * MIB), Verdict::Limit)
    );
    free_all(&limited, &used);

    let fixed = FixedSizeMemoryResource::with_options(
        HostMockResource::new(),
        FixedSizeOptions::new()
            .block_size(4096)
            .blocks_to_preallocate(2),
    )
    .unwrap();
    let r = fixed
        .allocate(s(), 8192, 256)
        .unwrap_err()
        .oom_report()
        .cloned()
        .unwrap();
    assert_eq!((r.reserved, r.verdict), (8192, Verdict::Limit));

    let mock = HostMockResource::new();
    let binning = BinningMemoryResource::new(mock.clone());
    mock.fail_next_allocations(1);
    let r = binning
        .allocate(s(), MIB, 256)
        .unwrap_err()
        .oom_report()
        .cloned()
        .unwrap();
    assert_eq!(r.verdict, Verdict::UpstreamRefused);
}
