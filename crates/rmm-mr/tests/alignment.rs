//! The alignment rule (the trait's "Alignment" section) on every resource that runs without a
//! GPU: the sub-allocators, the aligned adaptor, every adaptor and the callback resource over
//! host memory ([`HostMockResource`]), and the VMM pool over simulated memory, on the legacy
//! stream (whose lists and arenas need no CUDA call). The same checks run on the GPU as the conformance suite's alignment rows. Also:
//! refused requests are not counted, honoured over-aligned memory is usable to its last byte,
//! and sub-allocators refuse (and give back) misaligned chunks from their upstream.

#[path = "conformance/alignment.rs"]
mod alignment;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use alignment::{How, LARGE};
use rmm_mr::testing::HostMockResource;
use rmm_mr::{
    AlignedOptions, AlignedResourceAdaptor, ArenaMemoryResource, ArenaOptions,
    BinningMemoryResource, BinningOptions, CallbackMemoryResource, DeviceMemoryResource,
    FailureCallbackResourceAdaptor, FixedSizeMemoryResource, FixedSizeOptions,
    LimitingResourceAdaptor, LoggingOptions, LoggingResourceAdaptor, MrError, MrResult,
    PoolMemoryResource, PrefetchResourceAdaptor, SharedResource, StatisticsResourceAdaptor,
    ThreadSafeResourceAdaptor, TrackingResourceAdaptor, VmmPoolMemoryResource, VmmPoolOptions,
    MAX_OVER_ALIGNMENT,
};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn legacy() -> How<'static> {
    How::Stream(CudaStreamView::legacy())
}

fn s() -> CudaStreamView<'static> {
    CudaStreamView::legacy()
}

fn pool(mock: &HostMockResource) -> PoolMemoryResource<HostMockResource> {
    PoolMemoryResource::new(mock.clone(), 0).unwrap()
}

fn arena(mock: &HostMockResource) -> ArenaMemoryResource<HostMockResource> {
    ArenaMemoryResource::with_options(mock.clone(), ArenaOptions::new().arena_size(32 * MIB))
        .unwrap()
}

fn fixed(mock: &HostMockResource) -> FixedSizeMemoryResource<HostMockResource> {
    FixedSizeMemoryResource::with_options(
        mock.clone(),
        FixedSizeOptions::new()
            .block_size(512 * KIB)
            .blocks_to_preallocate(8),
    )
    .unwrap()
}

fn binning(mock: &HostMockResource) -> BinningMemoryResource<HostMockResource> {
    BinningMemoryResource::with_options(
        mock.clone(),
        BinningOptions::new()
            .min_size_exponent(10)
            .max_size_exponent(20),
    )
    .unwrap()
}

/// Every stack the rule is checked on, by name, with the largest alignment it must honour.
fn subjects(mock: &HostMockResource) -> Vec<(&'static str, SharedResource, usize)> {
    let m = || mock.clone();
    let pool_over_mock = || Arc::new(pool(mock)) as SharedResource;
    vec![
        ("host_mock", Arc::new(m()), MAX_OVER_ALIGNMENT),
        ("pool", Arc::new(pool(mock)), MAX_OVER_ALIGNMENT),
        ("arena", Arc::new(arena(mock)), MAX_OVER_ALIGNMENT),
        // Over simulated memory (addresses only: the checks never touch the memory).
        (
            "vmm_pool_simulated",
            Arc::new(VmmPoolMemoryResource::simulated(VmmPoolOptions::new(64 * MIB)).unwrap()),
            MAX_OVER_ALIGNMENT,
        ),
        ("fixed_size", Arc::new(fixed(mock)), 256),
        // Over-aligned requests go to the upstream, which honours up to 2 MiB.
        ("binning", Arc::new(binning(mock)), MAX_OVER_ALIGNMENT),
        (
            "binning_over_fixed_size",
            Arc::new(BinningMemoryResource::new(fixed(mock))),
            256,
        ),
        (
            "aligned_256",
            Arc::new(AlignedResourceAdaptor::new(pool_over_mock(), 256).unwrap()),
            MAX_OVER_ALIGNMENT,
        ),
        (
            "aligned_4096_threshold",
            Arc::new(
                AlignedResourceAdaptor::with_options(
                    m(),
                    AlignedOptions::new(4096).alignment_threshold(2000),
                )
                .unwrap(),
            ),
            MAX_OVER_ALIGNMENT,
        ),
        (
            "aligned_4_mib_over_pool",
            Arc::new(AlignedResourceAdaptor::new(pool(mock), 4 * MIB).unwrap()),
            4 * MIB,
        ),
        (
            "limiting_over_pool",
            Arc::new(LimitingResourceAdaptor::new(pool(mock), 64 * MIB)),
            MAX_OVER_ALIGNMENT,
        ),
        (
            "statistics_over_arena",
            Arc::new(StatisticsResourceAdaptor::new(arena(mock))),
            MAX_OVER_ALIGNMENT,
        ),
        (
            "tracking_over_fixed_size",
            Arc::new(TrackingResourceAdaptor::new(fixed(mock))),
            256,
        ),
        (
            "logging_over_binning",
            Arc::new(
                LoggingResourceAdaptor::with_options(
                    binning(mock),
                    LoggingOptions::new().writer(std::io::sink()),
                )
                .unwrap(),
            ),
            MAX_OVER_ALIGNMENT,
        ),
        (
            "thread_safe_over_pool",
            Arc::new(ThreadSafeResourceAdaptor::new(pool(mock))),
            MAX_OVER_ALIGNMENT,
        ),
        (
            "failure_callback_over_arena",
            Arc::new(FailureCallbackResourceAdaptor::new(arena(mock), |_| false)),
            MAX_OVER_ALIGNMENT,
        ),
        (
            "prefetch_over_pool",
            Arc::new(PrefetchResourceAdaptor::new(pool(mock))),
            MAX_OVER_ALIGNMENT,
        ),
        ("callback", callback(m()), 256),
    ]
}

/// A callback resource over `up`.
fn callback(up: impl DeviceMemoryResource + Clone) -> SharedResource {
    let a = up.clone();
    let alloc = move |bytes: usize, stream: CudaStreamView<'_>| a.allocate(stream, bytes, 256);
    let free = move |ptr: DevicePtr, bytes: usize, stream: CudaStreamView<'_>| {
        // SAFETY: the callback resource hands back only what `alloc` returned, with its size.
        unsafe { up.deallocate(stream, ptr, bytes, 256) }
    };
    // SAFETY: the closures forward to a resource, which keeps the contract.
    Arc::new(unsafe { CallbackMemoryResource::new(alloc, free) })
}

/// Runs `check` on every subject, then checks that nothing leaked.
fn on_every_subject(check: impl Fn(&str, &dyn DeviceMemoryResource, usize) -> Result<(), String>) {
    let mock = HostMockResource::new();
    let mut failures = Vec::new();
    for (name, mr, largest) in subjects(&mock) {
        if let Err(e) = check(name, &*mr, largest) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(mock.live_allocations(), 0, "memory leaked");
}

#[test]
fn alignment_zero_is_default() {
    on_every_subject(|_, mr, _| alignment::zero_is_default(mr, legacy()));
}

#[test]
fn alignment_not_pow2_is_error() {
    on_every_subject(|_, mr, _| alignment::not_pow2_is_error(mr, legacy()));
}

#[test]
fn alignment_large_honoured_or_refused() {
    on_every_subject(|_, mr, largest| {
        for bytes in [1000, 300 * KIB] {
            let named = alignment::large_honoured_or_refused(mr, legacy(), bytes)?;
            if named != Some(largest) {
                return Err(format!(
                    "{bytes} B: the largest alignment honoured is {named:?}, expected {largest}"
                ));
            }
        }
        Ok(())
    });
}

/// Fills `[p, p + len)` with `byte`.
///
/// # Safety
/// The range is host memory the caller owns.
unsafe fn fill(p: DevicePtr, len: usize, byte: u8) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_bytes(p.as_host_ptr::<u8>(), byte, len) }
}

/// Whether `[p, p + len)` holds `byte` only.
///
/// # Safety
/// The range is host memory the caller owns.
unsafe fn holds(p: DevicePtr, len: usize, byte: u8) -> bool {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p.as_host_ptr::<u8>(), len) }
        .iter()
        .all(|&b| b == byte)
}

/// Over-aligned allocations of the pool and the arena lie inside their blocks: many live at
/// once, each filled to its last byte, none disturbs another; freed with the same size and
/// alignment, their blocks are found again (nothing outstanding, nothing leaked).
#[test]
fn over_aligned_blocks_are_whole_and_found_again() {
    let mock = HostMockResource::new();
    let p = pool(&mock);
    let a = arena(&mock);
    for mr in [&p as &dyn DeviceMemoryResource, &a] {
        let mut live = Vec::new();
        for (i, &alignment) in LARGE.iter().take(5).cycle().take(40).enumerate() {
            let bytes = 1 + (i * 7919) % (40 * KIB);
            let ptr = mr.allocate(s(), bytes, alignment).unwrap();
            assert!(ptr.is_aligned(alignment), "{ptr} for {alignment}");
            let tag = i as u8;
            // SAFETY: host memory of an allocation of `bytes` this test owns.
            unsafe { fill(ptr, bytes, tag) };
            live.push((ptr, bytes, alignment, tag));
        }
        for &(ptr, bytes, alignment, tag) in &live {
            // SAFETY: as above; then freed once with the allocation's arguments.
            unsafe {
                assert!(holds(ptr, bytes, tag), "{ptr} was overwritten");
                mr.deallocate(s(), ptr, bytes, alignment).unwrap();
            }
        }
    }
    assert_eq!(p.outstanding_allocations(), 0);
    drop((p, a));
    assert_eq!(mock.live_allocations(), 0);
}

/// A free with another alignment than the allocation's is reported, changes nothing, and the
/// right free still works.
#[test]
fn over_aligned_free_with_wrong_alignment_is_reported() {
    let mock = HostMockResource::new();
    let p = pool(&mock);
    let a = arena(&mock);
    for mr in [&p as &dyn DeviceMemoryResource, &a] {
        let ptr = mr.allocate(s(), 1000, 8192).unwrap();
        // SAFETY: wrong frees the resources detect; then the right one.
        unsafe {
            for wrong in [256, 4096, 16384] {
                let e = mr.deallocate(s(), ptr, 1000, wrong).unwrap_err();
                assert!(matches!(e, MrError::InvalidFree { .. }), "{wrong}: {e}");
            }
            mr.deallocate(s(), ptr, 1000, 8192).unwrap();
            let e = mr.deallocate(s(), ptr, 1000, 8192).unwrap_err();
            assert!(matches!(e, MrError::InvalidFree { .. }), "double free: {e}");
        }
    }
    assert_eq!(p.outstanding_allocations(), 0);
}

/// Statistics, tracking and limiting adaptors do not count a refused request.
#[test]
fn refused_requests_are_not_counted() {
    let mock = HostMockResource::new();
    let stats = StatisticsResourceAdaptor::new(fixed(&mock));
    let tracking = TrackingResourceAdaptor::new(fixed(&mock));
    let limiting = LimitingResourceAdaptor::new(fixed(&mock), 64 * MIB);
    for mr in [&stats as &dyn DeviceMemoryResource, &tracking, &limiting] {
        for alignment in [3, 768, 512, 1 << 40] {
            assert!(matches!(
                mr.allocate(s(), 1000, alignment),
                Err(MrError::BadAlloc { .. })
            ));
        }
    }
    let (bytes, allocations) = stats.counters();
    assert_eq!((bytes.value, bytes.total, bytes.peak), (0, 0, 0));
    assert_eq!((allocations.value, allocations.total), (0, 0));
    assert_eq!(tracking.allocated_bytes(), 0);
    assert!(tracking.outstanding_allocations().is_empty());
    assert_eq!(tracking.error_count(), 0);
    assert_eq!(limiting.allocated_bytes(), 0);
    // A request that is served is counted (the counters can move).
    let p = stats.allocate(s(), 1000, 0).unwrap();
    assert_eq!(stats.counters().1.value, 1);
    // SAFETY: `p` came from `stats` with these arguments.
    unsafe { stats.deallocate(s(), p, 1000, 0).unwrap() };
}

// --- misaligned upstream chunks ----------------------------------------------------------------

/// An upstream that shifts the host memory it hands out by a settable offset (still `bytes`
/// long and valid): a broken resource, as a test double. Frees undo the shift.
#[derive(Debug, Clone)]
struct Shifting {
    mock: HostMockResource,
    offset: Arc<AtomicU64>,
}

impl Shifting {
    fn new(offset: u64) -> Self {
        Self {
            mock: HostMockResource::new(),
            offset: Arc::new(AtomicU64::new(offset)),
        }
    }

    fn shift(&self, offset: u64) {
        self.offset.store(offset, Ordering::SeqCst);
    }
}

// SAFETY: NOT sound as a resource: it breaks the alignment promise on purpose, to test that
// the sub-allocators over it refuse its chunks. The memory itself is valid host memory of at
// least `bytes` bytes, and these tests never hand it to a device.
unsafe impl DeviceMemoryResource for Shifting {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let offset = self.offset.load(Ordering::SeqCst);
        let p = self.mock.allocate(stream, bytes + 256, alignment)?;
        Ok(DevicePtr::from_raw(p.addr() + offset))
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // Any live block was handed out with an offset below 256.
        let base = DevicePtr::from_raw(ptr.addr() & !255);
        // SAFETY: forwarded contract.
        unsafe { self.mock.deallocate(stream, base, bytes + 256, alignment) }
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        other
            .as_any()
            .downcast_ref::<Self>()
            .is_some_and(|o| Arc::ptr_eq(&o.offset, &self.offset))
    }

    fn properties(&self) -> rmm_mr::ResourceProperties {
        self.mock.properties()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn assert_refused<T: std::fmt::Debug>(r: MrResult<T>, what: &str) {
    match r {
        Err(MrError::BadAlloc { message, .. }) => {
            assert!(
                message.contains("not 256-byte aligned"),
                "{what}: {message}"
            )
        }
        other => panic!("{what}: {other:?}, not a refusal of the misaligned chunk"),
    }
}

#[test]
fn misaligned_upstream_chunks_are_refused_and_given_back() {
    let up = Shifting::new(128);
    assert_refused(
        PoolMemoryResource::new(up.clone(), MIB),
        "pool's initial chunk",
    );
    assert_refused(
        FixedSizeMemoryResource::with_options(
            up.clone(),
            FixedSizeOptions::new()
                .block_size(KIB)
                .blocks_to_preallocate(4),
        ),
        "fixed-size's first chunk",
    );
    assert_refused(
        ArenaMemoryResource::with_options(up.clone(), ArenaOptions::new().arena_size(2 * MIB)),
        "arena's upstream allocation",
    );
    assert_refused(
        BinningMemoryResource::with_options(
            up.clone(),
            BinningOptions::new()
                .min_size_exponent(10)
                .max_size_exponent(12),
        ),
        "a binning resource's bins",
    );
    // Pointers passed on unchanged: binning's upstream route, the aligned adaptor's pass
    // through, the callback resource.
    let binning = BinningMemoryResource::new(up.clone());
    assert_refused(binning.allocate(s(), 1000, 256), "binning's upstream route");
    let aligned = AlignedResourceAdaptor::new(up.clone(), 256).unwrap();
    assert_refused(aligned.allocate(s(), 1000, 256), "aligned pass-through");
    let cb = callback(up.clone());
    assert_refused(cb.allocate(s(), 1000, 256), "callback resource");
    assert_eq!(up.mock.live_allocations(), 0, "a refused chunk leaked");
    assert!(
        up.mock.allocation_calls() > 0,
        "the upstream was never asked"
    );
}

#[test]
fn misaligned_chunks_are_refused_when_growing_too() {
    let up = Shifting::new(0);
    let pool = PoolMemoryResource::new(up.clone(), MIB).unwrap();
    let fixed = FixedSizeMemoryResource::with_options(
        up.clone(),
        FixedSizeOptions::new()
            .block_size(KIB)
            .blocks_to_preallocate(1),
    )
    .unwrap();
    let held = fixed.allocate(s(), KIB, 256).unwrap();
    assert_eq!(up.mock.live_allocations(), 2);
    up.shift(16);
    // More than the initial chunk: the pool must grow.
    assert_refused(pool.allocate(s(), 2 * MIB, 256), "pool growth");
    assert_refused(fixed.allocate(s(), KIB, 256), "fixed-size growth");
    assert_eq!(up.mock.live_allocations(), 2, "a refused chunk leaked");
    assert_eq!(pool.pool_size(), MIB);
    // The resources still work from what they hold.
    let p = pool.allocate(s(), KIB, 4096).unwrap();
    assert!(p.is_aligned(4096));
    // SAFETY: each came from its resource with these arguments.
    unsafe {
        pool.deallocate(s(), p, KIB, 4096).unwrap();
        fixed.deallocate(s(), held, KIB, 256).unwrap();
    }
    drop((pool, fixed));
    assert_eq!(up.mock.live_allocations(), 0);
}
