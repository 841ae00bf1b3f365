//! CPU tests of the arena resource over the host-memory mock, on the legacy and per-thread
//! default streams (whose arenas are found without any CUDA call). The memory the mock hands
//! out is host memory, so the tests write into it to check that allocations never overlap.
//!
//! On a machine with a GPU the same tests run with events and synchronizations enabled;
//! `settle()` makes pending large frees visible where a test needs them to be.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::mpsc;

use proptest::prelude::*;
use rmm_stream::CudaStreamView;
use rmm_sys::fault::{self, DriverCall, FaultScope};
use rmm_sys::DevicePtr;

use super::state::Snapshot;
use super::{ArenaMemoryResource, ArenaOptions};
use crate::error::{InvalidFree, MrError};
use crate::resource::{shared, DeviceMemoryResource};
use crate::testing::{HostMockResource, Rng};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

type Arena = ArenaMemoryResource<HostMockResource>;

fn legacy() -> CudaStreamView<'static> {
    CudaStreamView::legacy()
}

fn per_thread() -> CudaStreamView<'static> {
    CudaStreamView::per_thread()
}

fn arena(size: usize) -> (HostMockResource, Arena) {
    let mock = HostMockResource::new();
    let mr = ArenaMemoryResource::with_options(mock.clone(), ArenaOptions::new().arena_size(size))
        .unwrap_or_else(|e| panic!("arena of {size} B: {e}"));
    (mock, mr)
}

fn alloc(mr: &Arena, stream: CudaStreamView<'_>, bytes: usize) -> DevicePtr {
    mr.allocate(stream, bytes, 256)
        .unwrap_or_else(|e| panic!("allocate {bytes} B: {e}"))
}

fn free(mr: &Arena, stream: CudaStreamView<'_>, ptr: DevicePtr, bytes: usize) {
    // SAFETY: the tests free what they allocated from `mr` (or check the error for wrong
    // frees); the memory is host memory no device work uses.
    unsafe { mr.deallocate(stream, ptr, bytes, 256) }
        .unwrap_or_else(|e| panic!("free {ptr} ({bytes} B): {e}"));
}

fn try_free(mr: &Arena, stream: CudaStreamView<'_>, ptr: DevicePtr, bytes: usize) -> MrError {
    // SAFETY: as `free`; these frees are wrong on purpose and must change nothing.
    match unsafe { mr.deallocate(stream, ptr, bytes, 256) } {
        Ok(()) => panic!("freeing {ptr} ({bytes} B) should fail"),
        Err(e) => e,
    }
}

fn kind(e: &MrError) -> InvalidFree {
    match e {
        MrError::InvalidFree { kind, .. } => kind.clone(),
        other => panic!("expected InvalidFree, got {other}"),
    }
}

fn snapshot(mr: &Arena) -> Snapshot {
    mr.inner.snapshot()
}

fn base(mr: &Arena) -> u64 {
    mr.inner.base_addr()
}

/// Fills `[ptr, ptr + bytes)` of the mock's host memory with `value`.
fn fill(ptr: DevicePtr, bytes: usize, value: u8) {
    // SAFETY: `ptr` is a live allocation of at least `bytes` bytes inside the mock's host
    // allocation, owned by the caller.
    unsafe { std::ptr::write_bytes(ptr.as_host_ptr::<u8>(), value, bytes) };
}

/// Whether `[ptr, ptr + bytes)` still holds `value` everywhere.
fn holds(ptr: DevicePtr, bytes: usize, value: u8) -> bool {
    // SAFETY: as `fill`; only read.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.as_host_ptr::<u8>().cast_const(), bytes) };
    bytes.iter().all(|&b| b == value)
}

/// Fills `[ptr, ptr + bytes)` with the 8-byte `tag` (its low byte in a trailing partial word).
fn fill_tag(ptr: DevicePtr, bytes: usize, tag: u64) {
    let words = bytes / 8;
    // SAFETY: `ptr` is 256-aligned, live and at least `bytes` long (owned by the caller).
    let slice = unsafe { std::slice::from_raw_parts_mut(ptr.as_host_ptr::<u64>(), words) };
    slice.fill(tag);
    if let Some(tail) = ptr.checked_add(words * 8) {
        fill(tail, bytes % 8, tag as u8);
    }
}

/// Whether `[ptr, ptr + bytes)` still holds `tag` (see [`fill_tag`]).
fn holds_tag(ptr: DevicePtr, bytes: usize, tag: u64) -> bool {
    let words = bytes / 8;
    // SAFETY: as `fill_tag`; only read.
    let slice = unsafe { std::slice::from_raw_parts(ptr.as_host_ptr::<u64>().cast_const(), words) };
    slice.iter().all(|&w| w == tag)
        && ptr
            .checked_add(words * 8)
            .is_some_and(|tail| holds(tail, bytes % 8, tag as u8))
}

#[test]
fn construction_takes_one_upstream_allocation_and_drop_returns_it() {
    let (mock, mr) = arena(4 * MIB);
    assert_eq!(mock.allocation_calls(), 1);
    assert_eq!(mock.live_bytes(), 4 * MIB);
    assert_eq!(mr.arena_size(), 4 * MIB);
    assert!(mr.upstream().is_equal(&mock));
    let copy = mr.clone();
    let p = alloc(&copy, legacy(), 1000);
    drop(mr);
    assert_eq!(mock.live_allocations(), 1, "a clone keeps the arena alive");
    free(&copy, legacy(), p, 1000);
    drop(copy);
    assert_eq!(mock.live_allocations(), 0);
    assert_eq!(mock.deallocation_calls(), 1);
}

#[test]
fn drop_with_outstanding_allocations_still_returns_the_arena() {
    let (mock, mr) = arena(4 * MIB);
    let _small = alloc(&mr, legacy(), 256);
    let _large = alloc(&mr, legacy(), 2 * MIB);
    let _other = alloc(&mr, per_thread(), 256);
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
}

#[test]
fn arena_size_is_checked_and_aligned_down() {
    for size in [0, 256, MIB - 1, MIB - 256] {
        let mock = HostMockResource::new();
        let e =
            ArenaMemoryResource::with_options(mock.clone(), ArenaOptions::new().arena_size(size))
                .unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)), "{size}: {e}");
        assert!(
            e.to_string()
                .contains("Arena size smaller than minimum superblock size."),
            "{e}"
        );
        assert_eq!(mock.allocation_calls(), 0, "nothing allocated for {size}");
    }
    let (mock, mr) = arena(MIB + 300);
    assert_eq!(mr.arena_size(), MIB + 256);
    assert_eq!(mock.live_bytes(), MIB + 256);
}

/// Without a GPU the default size (half of the device's free memory) cannot be known. (With
/// one, the mock would have to hand out that much host memory: the GPU tests cover it.)
#[test]
fn default_size_needs_a_device() {
    if rmm_sys::gpu_unavailable_reason().is_none() {
        return;
    }
    let mock = HostMockResource::new();
    let e = ArenaMemoryResource::new(mock.clone()).unwrap_err();
    assert!(e.is_no_device(), "{e}");
    assert_eq!(mock.allocation_calls(), 0);
}

#[test]
fn upstream_failure_is_passed_on() {
    let mock = HostMockResource::new();
    mock.fail_next_allocations(1);
    let e =
        ArenaMemoryResource::with_options(mock.clone(), ArenaOptions::new().arena_size(4 * MIB))
            .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(mock.live_allocations(), 0);
}

#[test]
fn zero_bytes_and_null_are_no_ops() {
    let (mock, mr) = arena(4 * MIB);
    assert_eq!(mr.allocate(legacy(), 0, 256).unwrap(), DevicePtr::NULL);
    assert_eq!(mr.allocate(per_thread(), 0, 256).unwrap(), DevicePtr::NULL);
    free(&mr, legacy(), DevicePtr::NULL, 0);
    free(&mr, legacy(), DevicePtr::NULL, 4096);
    let p = alloc(&mr, legacy(), 512);
    free(&mr, legacy(), p, 0); // ignored: `p` stays allocated
    let q = alloc(&mr, legacy(), 512);
    assert_ne!(p, q);
    free(&mr, legacy(), p, 512);
    free(&mr, legacy(), q, 512);
    assert_eq!(snapshot(&mr).arenas, 1);
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
}

#[test]
fn small_blocks_are_first_fit_rounded_and_reused() {
    let (_mock, mr) = arena(4 * MIB);
    let start = base(&mr);
    // The legacy arena gets the first superblock; alignments up to 256 need nothing more.
    let a = mr.allocate(legacy(), 1, 128).unwrap();
    let b = alloc(&mr, legacy(), 257);
    let c = alloc(&mr, legacy(), 256);
    assert_eq!(a.addr(), start);
    assert_eq!(b.addr(), start + 256, "1 B rounds to 256");
    assert_eq!(c.addr(), start + 768, "257 B rounds to 512");
    assert!(a.is_aligned(256) && b.is_aligned(256) && c.is_aligned(256));
    fill(a, 1, 0xa1);
    fill(b, 257, 0xb2);
    fill(c, 256, 0xc3);
    assert!(holds(a, 1, 0xa1) && holds(b, 257, 0xb2) && holds(c, 256, 0xc3));
    free(&mr, legacy(), b, 257);
    // A 512-byte hole is reused first (address order), also for a smaller request.
    let d = alloc(&mr, legacy(), 300);
    assert_eq!(d, b);
    free(&mr, legacy(), a, 1);
    free(&mr, legacy(), c, 256);
    free(&mr, legacy(), d, 300);
    let s = snapshot(&mr);
    assert_eq!((s.lent_superblocks, s.free_blocks), (1, 1));
}

#[test]
fn large_blocks_come_from_the_global_arena_and_are_reused() {
    let (_mock, mr) = arena(8 * MIB);
    let start = base(&mr);
    let big = alloc(&mr, legacy(), 3 * MIB);
    assert_eq!(
        big.addr(),
        start,
        "a large request takes the first superblock"
    );
    assert_eq!(snapshot(&mr).large_live, 1);
    let exactly_one_mib = alloc(&mr, legacy(), MIB);
    assert_eq!(
        snapshot(&mr).lent_superblocks,
        1,
        "1 MiB is small: served by a local arena"
    );
    fill(big, 3 * MIB, 0x5a);
    fill(exactly_one_mib, MIB, 0x33);
    assert!(holds(big, 3 * MIB, 0x5a));
    free(&mr, legacy(), big, 3 * MIB);
    mr.inner.settle();
    let s = snapshot(&mr);
    assert_eq!((s.large_live, s.pending), (0, 0));
    let again = alloc(&mr, per_thread(), 3 * MIB);
    assert_eq!(
        again, big,
        "the freed large block is reused from any stream"
    );
    free(&mr, per_thread(), again, 3 * MIB);
    free(&mr, legacy(), exactly_one_mib, MIB);
}

/// A large free keeps its superblock in the freeing stream's arena: that stream's next large
/// requests reuse it without the global arena (and, with a GPU, without any event), other
/// streams do not see it until it goes back (defragmentation, thread exit, `settle` here).
#[test]
fn large_frees_keep_their_superblock_for_their_stream() {
    let (mock, mr) = arena(256 * MIB);
    let start = base(&mr);
    let big = alloc(&mr, legacy(), 3 * MIB);
    assert_eq!(big.addr(), start);
    fill(big, 3 * MIB, 0x11);
    free(&mr, legacy(), big, 3 * MIB);
    let s = snapshot(&mr);
    assert_eq!((s.large_live, s.pending, s.lent_superblocks), (0, 0, 1));
    // Another stream gets other memory...
    let other = alloc(&mr, per_thread(), 3 * MIB);
    assert_ne!(other, big);
    // ...the freeing stream gets its block back, also for a smaller request.
    let again = alloc(&mr, legacy(), 2 * MIB);
    assert_eq!(again, big);
    let s = snapshot(&mr);
    assert_eq!(
        (s.large_live, s.lent_superblocks),
        (1, 1),
        "only `other` is a large allocation of the global arena"
    );
    fill(again, 2 * MIB, 0x22);
    assert!(holds(again, 2 * MIB, 0x22));
    // Wrong frees of a block in a kept superblock are still caught, from any stream.
    assert_eq!(
        kind(&try_free(&mr, legacy(), again, 3 * MIB)),
        InvalidFree::SizeMismatch { allocated: 2 * MIB }
    );
    assert_eq!(
        kind(&try_free(&mr, per_thread(), again, 256)),
        InvalidFree::SizeMismatch { allocated: 2 * MIB }
    );
    free(&mr, legacy(), again, 2 * MIB);
    assert_eq!(
        kind(&try_free(&mr, legacy(), again, 2 * MIB)),
        InvalidFree::DoubleFree
    );
    assert_eq!(
        kind(&try_free(&mr, per_thread(), again, 2 * MIB)),
        InvalidFree::DoubleFree
    );
    free(&mr, per_thread(), other, 3 * MIB);
    // Both streams kept one superblock; settling gives them back to the global arena.
    assert_eq!(snapshot(&mr).lent_superblocks, 2);
    mr.inner.settle();
    let s = snapshot(&mr);
    assert!(s.fully_coalesced, "{s:?}");
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
}

/// A block allocated from a kept superblock and freed on another stream goes back to the
/// arena that kept it (with a GPU, with a fence that arena's stream waits on).
#[test]
fn kept_blocks_freed_by_another_stream_go_back_to_their_arena() {
    let (_mock, mr) = arena(256 * MIB);
    let big = alloc(&mr, legacy(), 3 * MIB);
    free(&mr, legacy(), big, 3 * MIB);
    let again = alloc(&mr, legacy(), 3 * MIB);
    assert_eq!(again, big);
    free(&mr, per_thread(), again, 3 * MIB);
    assert_eq!(
        snapshot(&mr).lent_superblocks,
        1,
        "still kept by the legacy arena"
    );
    let third = alloc(&mr, legacy(), 3 * MIB);
    assert_eq!(third, big);
    free(&mr, legacy(), third, 3 * MIB);
}

/// A stream keeps a bounded amount free in kept superblocks (here, in a small arena, a quarter
/// of it); larger frees go back to the global arena.
#[test]
fn kept_memory_is_bounded() {
    let (_mock, mr) = arena(16 * MIB);
    // The limit is 4 MiB here.
    let a = alloc(&mr, legacy(), 3 * MIB);
    let b = alloc(&mr, legacy(), 2 * MIB);
    let c = alloc(&mr, legacy(), 5 * MIB);
    free(&mr, legacy(), c, 5 * MIB);
    assert_eq!(snapshot(&mr).lent_superblocks, 0, "5 MiB is over the limit");
    free(&mr, legacy(), a, 3 * MIB);
    assert_eq!(snapshot(&mr).lent_superblocks, 1);
    free(&mr, legacy(), b, 2 * MIB);
    assert_eq!(
        snapshot(&mr).lent_superblocks,
        1,
        "3 + 2 MiB is over the limit"
    );
    mr.inner.settle();
    assert!(snapshot(&mr).fully_coalesced);
}

/// A large free its arena may not keep (over the kept-memory limit) takes the global lock once,
/// to give the block back (or queue it), not a second time to learn that it may not keep it;
/// one it keeps takes it once.
#[test]
fn a_large_free_takes_the_global_lock_once() {
    let (_mock, mr) = arena(16 * MIB);
    let holds = || mr.global_lock_holds().count();
    // The limit is 4 MiB here.
    let a = alloc(&mr, legacy(), 3 * MIB);
    let c = alloc(&mr, legacy(), 5 * MIB);
    let before = holds();
    free(&mr, legacy(), c, 5 * MIB);
    assert_eq!(holds() - before, 1, "a free over the limit");
    assert_eq!(snapshot(&mr).lent_superblocks, 0, "5 MiB is over the limit");
    let before = holds();
    free(&mr, legacy(), a, 3 * MIB);
    assert_eq!(holds() - before, 1, "a kept free");
    assert_eq!(snapshot(&mr).lent_superblocks, 1, "kept");
    // Served by the kept superblock, freed into it: no global lock at all.
    let before = holds();
    let b = alloc(&mr, legacy(), 2 * MIB);
    free(&mr, legacy(), b, 2 * MIB);
    assert_eq!(holds() - before, 0, "kept memory");
    mr.inner.settle();
    assert!(snapshot(&mr).fully_coalesced);
}

/// A reclaim of many empty superblocks (about 9,000 kept ones here) gives them back in
/// `O(log n)` each, a batch to a hold of the global lock: it held the lock for 1.6 s (debug
/// build) while the superblocks in transit were a list searched once per superblock, 31 ms
/// with a map in one hold.
#[test]
fn a_reclaim_of_many_superblocks_holds_the_global_lock_briefly() {
    let count = if cfg!(miri) { 50 } else { 10_000 };
    let memory = crate::SimulatedMemoryResource::new(64 << 30).unwrap();
    let mr = ArenaMemoryResource::with_options(memory, ArenaOptions::new().arena_size(64 << 30))
        .unwrap();
    let size = 3 * MIB / 2;
    let ptrs: Vec<DevicePtr> = (0..count)
        .map(|_| mr.allocate(legacy(), size, 256).unwrap())
        .collect();
    for p in ptrs {
        // SAFETY: allocated above with this size, freed once; simulated memory, never used.
        unsafe { mr.deallocate(legacy(), p, size, 256) }.unwrap();
    }
    let kept = mr.inner.snapshot().lent_superblocks;
    assert!(kept >= count * 3 / 4, "{kept} of {count} kept");
    let before = mr.global_lock_holds();
    mr.inner.reclaim_now().unwrap();
    let holds = mr.global_lock_holds().since(&before);
    assert!(mr.inner.snapshot().fully_coalesced);
    if !cfg!(miri) {
        // The longest of the reclaim's holds (the record's longest overall: allocations and
        // frees above hold it for microseconds).
        assert!(
            holds.max() < std::time::Duration::from_millis(400),
            "{:?}",
            holds.max()
        );
    }
}

/// When memory runs out, defragmentation takes the kept superblocks back like the others.
#[test]
fn defragmentation_takes_kept_superblocks_back() {
    let (_mock, mr) = arena(16 * MIB);
    let a = alloc(&mr, legacy(), 3 * MIB);
    free(&mr, legacy(), a, 3 * MIB);
    assert_eq!(snapshot(&mr).lent_superblocks, 1);
    // The whole arena: only possible once the kept superblock is back.
    let whole = alloc(&mr, per_thread(), 16 * MIB);
    assert_eq!(whole.addr(), base(&mr));
    let s = snapshot(&mr);
    assert_eq!((s.lent_superblocks, s.arenas), (0, 0));
    free(&mr, per_thread(), whole, 16 * MIB);
}

#[test]
fn thread_exit_returns_kept_superblocks() {
    let (_mock, mr) = arena(256 * MIB);
    let worker = mr.clone();
    std::thread::spawn(move || {
        let p = alloc(&worker, per_thread(), 3 * MIB);
        free(&worker, per_thread(), p, 3 * MIB);
        assert_eq!(snapshot(&worker).lent_superblocks, 1);
        let q = alloc(&worker, per_thread(), 3 * MIB);
        assert_eq!(q, p);
        free(&worker, per_thread(), q, 3 * MIB);
    })
    .join()
    .unwrap();
    let s = snapshot(&mr);
    assert_eq!((s.lent_superblocks, s.arenas), (0, 0));
    assert!(s.fully_coalesced);
}

#[test]
fn size_classes_round_like_rmm() {
    let mock = HostMockResource::new();
    let options = ArenaOptions {
        arena_size: Some(4 * MIB),
        use_size_classes: true,
        ..ArenaOptions::default()
    };
    let mr = ArenaMemoryResource::with_options(mock, options).unwrap();
    assert!(mr.uses_size_classes());
    let a = alloc(&mr, legacy(), 17 * KIB);
    let b = alloc(&mr, legacy(), 1);
    assert_eq!(
        b.addr() - a.addr(),
        20 * KIB as u64,
        "17 KiB -> 20 KiB class"
    );
    // A free with another size of the same class is the same allocation.
    free(&mr, legacy(), a, 18 * KIB);
    let e = try_free(&mr, legacy(), b, 3000);
    assert_eq!(kind(&e), InvalidFree::SizeMismatch { allocated: 256 });
    free(&mr, legacy(), b, 200);
}

#[test]
fn wrong_frees_are_typed_errors_and_change_nothing() {
    let (mock, mr) = arena(8 * MIB);
    let small = alloc(&mr, legacy(), 1000);
    let large = alloc(&mr, legacy(), 3 * MIB);
    // Outside the arena.
    let outside = DevicePtr::from_raw(0x1000);
    assert_eq!(
        kind(&try_free(&mr, legacy(), outside, 256)),
        InvalidFree::UnknownPointer
    );
    // Inside a live block but not at its start.
    let interior = DevicePtr::from_raw(small.addr() + 256);
    assert_eq!(
        kind(&try_free(&mr, legacy(), interior, 256)),
        InvalidFree::UnknownPointer
    );
    // Wrong sizes.
    assert_eq!(
        kind(&try_free(&mr, legacy(), small, 2000)),
        InvalidFree::SizeMismatch { allocated: 1024 }
    );
    assert_eq!(
        kind(&try_free(&mr, legacy(), large, 2 * MIB)),
        InvalidFree::SizeMismatch { allocated: 3 * MIB }
    );
    assert_eq!(
        kind(&try_free(&mr, legacy(), large, 256)),
        InvalidFree::SizeMismatch { allocated: 3 * MIB },
        "a small free of a large block"
    );
    // From another arena (the per-thread one) too.
    assert_eq!(
        kind(&try_free(&mr, per_thread(), small, 2000)),
        InvalidFree::SizeMismatch { allocated: 1024 }
    );
    // Too large to be any allocation.
    assert_eq!(
        kind(&try_free(&mr, legacy(), small, usize::MAX)),
        InvalidFree::UnknownPointer
    );
    // The right frees still work, once.
    free(&mr, legacy(), small, 1000);
    free(&mr, legacy(), large, 3 * MIB);
    assert_eq!(
        kind(&try_free(&mr, legacy(), small, 1000)),
        InvalidFree::DoubleFree
    );
    assert_eq!(
        kind(&try_free(&mr, legacy(), large, 3 * MIB)),
        InvalidFree::DoubleFree,
        "double free of a pending (or released) large block"
    );
    mr.inner.settle();
    assert_eq!(
        kind(&try_free(&mr, per_thread(), large, 3 * MIB)),
        InvalidFree::DoubleFree
    );
    // Nothing leaked: the whole arena can be allocated again (after defragmentation).
    let all = alloc(&mr, legacy(), 8 * MIB);
    assert_eq!(all.addr(), base(&mr));
    free(&mr, legacy(), all, 8 * MIB);
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
}

#[test]
fn exhaustion_defragments_and_retries() {
    let (_mock, mr) = arena(4 * MIB);
    // The legacy arena takes all four superblocks, then frees everything: the superblocks stay
    // in the legacy arena, so the global arena is empty.
    let blocks: Vec<DevicePtr> = (0..4).map(|_| alloc(&mr, legacy(), MIB)).collect();
    assert_eq!(snapshot(&mr).lent_superblocks, 4);
    for &p in &blocks {
        free(&mr, legacy(), p, MIB);
    }
    let s = snapshot(&mr);
    assert_eq!((s.lent_superblocks, s.free_blocks, s.arenas), (4, 0, 1));
    // A request of the whole arena succeeds once the empty superblocks are reclaimed.
    let whole = alloc(&mr, legacy(), 4 * MIB);
    assert_eq!(whole.addr(), base(&mr));
    let s = snapshot(&mr);
    assert_eq!(
        (s.lent_superblocks, s.arenas),
        (0, 0),
        "making room retires the arenas it left empty"
    );
    free(&mr, legacy(), whole, 4 * MIB);
    // Same for a small request from another arena while the legacy one holds everything.
    let blocks: Vec<DevicePtr> = (0..4).map(|_| alloc(&mr, legacy(), 600 * KIB)).collect();
    free(&mr, legacy(), blocks[1], 600 * KIB);
    let p = alloc(&mr, per_thread(), 900 * KIB);
    assert_eq!(
        p, blocks[1],
        "the freed superblock moved to the per-thread arena"
    );
    free(&mr, per_thread(), p, 900 * KIB);
    for &b in [blocks[0], blocks[2], blocks[3]].iter() {
        free(&mr, legacy(), b, 600 * KIB);
    }
}

#[test]
fn out_of_memory_when_truly_full() {
    let mock = HostMockResource::new();
    let mr = ArenaMemoryResource::with_options(
        mock.clone(),
        ArenaOptions::new()
            .arena_size(4 * MIB)
            .dump_log_on_failure(true),
    )
    .unwrap();
    assert!(mr.dumps_log_on_failure());
    let whole = alloc(&mr, legacy(), 4 * MIB);
    for (stream, bytes) in [
        (legacy(), 256),
        (per_thread(), 256),
        (legacy(), 2 * MIB),
        (legacy(), 8 * MIB),
        (legacy(), usize::MAX),
    ] {
        let e = mr.allocate(stream, bytes, 256).unwrap_err();
        assert!(
            matches!(e, MrError::OutOfMemory { requested, .. } if requested == bytes),
            "{e}"
        );
        let text = e.to_string();
        assert!(text.contains("out_of_memory"), "{text}");
        assert!(
            text.contains(&format!(
                "Maximum pool size exceeded (failed to allocate {bytes} bytes): No room in arena."
            )),
            "{text}"
        );
        assert_eq!(
            snapshot(&mr).arenas,
            0,
            "a failed request leaves no empty arena behind"
        );
    }
    let dump = mr.memory_dump();
    assert!(dump.contains("Arena size: 4.000000 MiB"), "{dump}");
    assert!(dump.contains("Large allocations live: 1"), "{dump}");
    free(&mr, legacy(), whole, 4 * MIB);
    let p = alloc(&mr, legacy(), 256);
    assert!(mr.memory_dump().contains("legacy default stream arena"));
    free(&mr, legacy(), p, 256);
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
}

/// RMM `ArenaTest.PerThreadToStreamDealloc`, without CUDA: RMM's owned stream becomes the
/// per-thread arena of a helper thread that stays alive, RMM's default stream the legacy one.
/// A block allocated in a per-thread arena whose superblock went back to the global arena
/// (defragmentation), after the legacy arena took the memory beside it, can still be freed
/// from the per-thread stream.
#[test]
fn per_thread_to_stream_free() {
    let (_mock, mr) = arena(2 * MIB);
    let thread_ptr = alloc(&mr, per_thread(), 256);
    assert_eq!(thread_ptr.addr(), base(&mr));
    let (done_tx, done_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel::<()>();
    let helper = {
        let mr = mr.clone();
        std::thread::spawn(move || {
            let p = alloc(&mr, per_thread(), 32 * KIB);
            free(&mr, per_thread(), p, 32 * KIB);
            done_tx.send(()).unwrap();
            exit_rx.recv().unwrap();
        })
    };
    done_rx.recv().unwrap();
    assert_eq!(snapshot(&mr).free_blocks, 0, "the global arena is empty");
    // The helper's empty superblock is reclaimed for the legacy arena...
    let ptr1 = alloc(&mr, legacy(), MIB);
    assert_eq!(ptr1.addr(), base(&mr) + MIB as u64);
    // ...then defragmentation dissolves this thread's superblock: the memory beside
    // `thread_ptr`, less than a superblock, is lent whole.
    let ptr2 = alloc(&mr, legacy(), 32 * KIB);
    assert_eq!(ptr2.addr(), thread_ptr.addr() + 256);
    let s = snapshot(&mr);
    assert_eq!((s.lent_superblocks, s.arenas), (1, 1));
    free(&mr, per_thread(), thread_ptr, 256);
    free(&mr, legacy(), ptr1, MIB);
    free(&mr, legacy(), ptr2, 32 * KIB);
    let whole = alloc(&mr, per_thread(), 2 * MIB);
    free(&mr, per_thread(), whole, 2 * MIB);
    exit_tx.send(()).unwrap();
    helper.join().unwrap();
}

/// A large block this thread allocated on its per-thread stream and another thread frees on
/// its own is not kept by the freeing thread's arena: that thread's stream does not wait for
/// this thread's work (with a GPU the block waits for an event on the legacy stream; without
/// one it goes straight back to the global arena). A free on the allocating thread keeps it.
#[test]
fn large_blocks_freed_on_another_threads_per_thread_stream_are_not_kept() {
    let (_mock, mr) = arena(256 * MIB);
    let big = alloc(&mr, per_thread(), 3 * MIB);
    std::thread::scope(|sc| {
        sc.spawn(|| free(&mr, per_thread(), big, 3 * MIB));
    });
    mr.inner.settle();
    let s = snapshot(&mr);
    assert_eq!(
        (s.large_live, s.pending, s.lent_superblocks),
        (0, 0, 0),
        "kept by the freeing thread's arena: {s:?}"
    );
    assert!(s.fully_coalesced);
    // Freed on the allocating thread: kept, as before.
    let again = alloc(&mr, per_thread(), 3 * MIB);
    assert_eq!(again, big);
    free(&mr, per_thread(), again, 3 * MIB);
    assert_eq!(snapshot(&mr).lent_superblocks, 1);
    // A large block allocated on the legacy stream and freed on another thread's per-thread
    // stream: the caller chose that stream, so that thread's arena keeps it.
    let shared = alloc(&mr, legacy(), 5 * MIB);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            free(&mr, per_thread(), shared, 5 * MIB);
            assert_eq!(snapshot(&mr).lent_superblocks, 2);
        });
    });
}

/// A superblock that goes back to the global arena partly used (defragmentation, thread exit)
/// dissolves there: its free memory merges with the free memory around it and serves any
/// stream, a large request across its old boundary included, while its live blocks stay where
/// they are and are freed from the global arena, from any stream (RMM lends such a superblock
/// whole to the next arena that needs room, blocks in use included).
#[test]
fn a_partly_used_superblock_dissolves_in_the_global_arena() {
    let (_mock, mr) = arena(2 * MIB);
    // This thread's arena takes the first 1 MiB superblock.
    let p = alloc(&mr, per_thread(), 256 * KIB);
    assert_eq!(p.addr(), base(&mr));
    let worker = mr.clone();
    // Joined (not scoped), so the thread's exit, which returns its arena, is over.
    let q = std::thread::spawn(move || {
        let mr = worker;
        // 1.5 MiB: more than the free 1 MiB superblock, less than what is free around `p`
        // once defragmentation dissolved its superblock.
        let big = alloc(&mr, per_thread(), 3 * MIB / 2);
        assert_eq!(big.addr(), p.addr() + 256 * KIB as u64);
        let s = snapshot(&mr);
        assert_eq!((s.lent_superblocks, s.arenas, s.large_live), (0, 0, 1));
        free(&mr, per_thread(), big, 3 * MIB / 2);
        mr.inner.settle();
        // The free memory beside `p` is lent whole to this thread's arena...
        let q = alloc(&mr, per_thread(), 256 * KIB);
        assert_eq!(q, big);
        assert_eq!(snapshot(&mr).lent_superblocks, 1);
        // ...and `p`, still in the global arena, is freed from this thread.
        free(&mr, per_thread(), p, 256 * KIB);
        mr.inner.settle();
        assert_eq!(
            kind(&try_free(&mr, per_thread(), p, 256 * KIB)),
            InvalidFree::DoubleFree
        );
        // `q` stays live: its superblock goes back to the global arena at thread exit.
        q
    })
    .join()
    .unwrap();
    let s = snapshot(&mr);
    assert_eq!((s.lent_superblocks, s.arenas), (0, 0), "{s:?}");
    // A superblock for this thread: the 1.5 MiB after `q`, lent whole (the 256 KiB before `q`
    // are a smaller fit, kept for when no 1 MiB is left).
    let r = alloc(&mr, per_thread(), 256 * KIB);
    assert_eq!(r.addr(), q.addr() + 256 * KIB as u64);
    free(&mr, legacy(), q, 256 * KIB);
    free(&mr, per_thread(), r, 256 * KIB);
    mr.inner.settle();
    let whole = alloc(&mr, legacy(), 2 * MIB);
    free(&mr, legacy(), whole, 2 * MIB);
}

#[test]
fn blocks_freed_from_another_arena_go_back_to_their_arena() {
    let (_mock, mr) = arena(4 * MIB);
    let a = alloc(&mr, per_thread(), 4 * KIB);
    let b = alloc(&mr, per_thread(), 4 * KIB);
    free(&mr, legacy(), a, 4 * KIB);
    assert_eq!(
        snapshot(&mr).lent_superblocks,
        1,
        "no superblock for legacy"
    );
    let c = alloc(&mr, per_thread(), 4 * KIB);
    assert_eq!(c, a, "reused by the arena that holds it");
    free(&mr, legacy(), b, 4 * KIB);
    free(&mr, legacy(), c, 4 * KIB);
}

#[test]
fn thread_exit_returns_its_superblocks() {
    let (mock, mr) = arena(8 * MIB);
    let worker = mr.clone();
    let kept = std::thread::spawn(move || {
        let a = alloc(&worker, per_thread(), 512 * KIB);
        let b = alloc(&worker, per_thread(), 512 * KIB);
        let c = alloc(&worker, per_thread(), 512 * KIB);
        assert_eq!(snapshot(&worker).lent_superblocks, 2);
        free(&worker, per_thread(), a, 512 * KIB);
        free(&worker, per_thread(), b, 512 * KIB);
        c.addr()
    })
    .join()
    .unwrap();
    let s = snapshot(&mr);
    assert_eq!(
        (s.lent_superblocks, s.arenas),
        (0, 0),
        "the exited thread's arena went back to the global arena"
    );
    assert!(!s.fully_coalesced, "one block is still live");
    // Its last block lives on in the global arena and is freed from there.
    free(&mr, legacy(), DevicePtr::from_raw(kept), 512 * KIB);
    mr.inner.settle();
    assert!(snapshot(&mr).fully_coalesced);
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
}

#[test]
fn a_thread_may_outlive_the_resource() {
    let (mock, mr) = arena(4 * MIB);
    let worker = mr.clone();
    let (to_main, from_worker) = mpsc::channel();
    let (to_worker, from_main) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        let p = alloc(&worker, per_thread(), 1000);
        free(&worker, per_thread(), p, 1000);
        drop(worker);
        to_main.send(()).unwrap();
        // Exit only after the resource is gone: the guard must find nothing to do.
        from_main.recv().unwrap();
    });
    from_worker.recv().unwrap();
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
    to_worker.send(()).unwrap();
    handle.join().unwrap();
}

#[test]
fn equality_and_shared_ownership() {
    let (_mock, mr) = arena(4 * MIB);
    let copy = mr.clone();
    assert!(mr.is_equal(&copy));
    assert!(mr.is_equal(&shared(copy.clone())));
    let (_other_mock, other) = arena(4 * MIB);
    assert!(!mr.is_equal(&other));
    assert!(!mr.is_equal(&HostMockResource::new()));
    let p = alloc(&mr, legacy(), 4096);
    free(&copy, legacy(), p, 4096);
    assert_eq!(mr.properties(), HostMockResource::new().properties());
    assert!(format!("{mr:?}").contains("arena_size: 4194304"));
}

/// Several threads on the legacy stream (one shared arena) and on their per-thread streams
/// (one arena each), small and large requests, frees of blocks handed over by other threads:
/// every block is written with its owner's pattern and checked before it is freed, so an
/// overlap between two live blocks fails the test.
#[test]
fn concurrent_threads_get_disjoint_blocks() {
    const THREADS: usize = 4;
    const STEPS: usize = 1500;
    let (mock, mr) = arena(64 * MIB);
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(u64, usize, u64)>())
        .unzip();
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, inbox)| {
            let mr = mr.clone();
            let next = senders[(t + 1) % THREADS].clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                let mut live: Vec<(DevicePtr, usize, u64, bool)> = Vec::new();
                for step in 0..STEPS {
                    // Free what the previous thread handed over, on this thread's stream.
                    while let Ok((addr, bytes, pattern)) = inbox.try_recv() {
                        let p = DevicePtr::from_raw(addr);
                        assert!(
                            holds_tag(p, bytes, pattern),
                            "handed-over block overwritten"
                        );
                        free(&mr, per_thread(), p, bytes);
                    }
                    if live.len() < 24 && rng.below(3) != 0 {
                        let bytes = if rng.below(8) == 0 {
                            MIB + 1 + rng.below(2 * MIB)
                        } else {
                            1 + rng.below(64 * KIB)
                        };
                        let on_legacy = rng.below(2) == 0;
                        let stream = if on_legacy { legacy() } else { per_thread() };
                        let p = match mr.allocate(stream, bytes, 256) {
                            Ok(p) => p,
                            Err(e) if e.is_out_of_memory() => continue,
                            Err(e) => panic!("{e}"),
                        };
                        let pattern = ((t as u64) << 32) | step as u64;
                        fill_tag(p, bytes, pattern);
                        live.push((p, bytes, pattern, on_legacy));
                    } else if !live.is_empty() {
                        let (p, bytes, pattern, on_legacy) =
                            live.swap_remove(rng.below(live.len()));
                        assert!(holds_tag(p, bytes, pattern), "block overwritten by another");
                        match rng.below(4) {
                            0 => next.send((p.addr(), bytes, pattern)).unwrap(),
                            _ => {
                                let stream = if on_legacy { legacy() } else { per_thread() };
                                free(&mr, stream, p, bytes);
                            }
                        }
                    }
                }
                for (p, bytes, pattern, _) in live {
                    assert!(holds_tag(p, bytes, pattern));
                    free(&mr, legacy(), p, bytes);
                }
                inbox
            })
        })
        .collect();
    drop(senders);
    let inboxes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for inbox in inboxes {
        while let Ok((addr, bytes, pattern)) = inbox.try_recv() {
            let p = DevicePtr::from_raw(addr);
            assert!(holds_tag(p, bytes, pattern));
            free(&mr, legacy(), p, bytes);
        }
    }
    mr.inner.settle();
    // Everything came back: the whole arena is one block again after defragmentation.
    let whole = alloc(&mr, legacy(), 64 * MIB);
    free(&mr, legacy(), whole, 64 * MIB);
    drop(mr);
    assert_eq!(mock.live_allocations(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { bytes: usize, per_thread: bool },
    Free { pick: usize, per_thread: bool },
    WrongSize { pick: usize },
    DoubleFree,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..=3 * MIB, any::<bool>())
            .prop_map(|(bytes, per_thread)| Op::Alloc { bytes, per_thread }),
        4 => (1usize..=64 * KIB, any::<bool>())
            .prop_map(|(bytes, per_thread)| Op::Alloc { bytes, per_thread }),
        5 => (any::<usize>(), any::<bool>())
            .prop_map(|(pick, per_thread)| Op::Free { pick, per_thread }),
        1 => any::<usize>().prop_map(|pick| Op::WrongSize { pick }),
        1 => Just(Op::DoubleFree),
    ]
}

fn stream_of(per_thread_stream: bool) -> CudaStreamView<'static> {
    if per_thread_stream {
        per_thread()
    } else {
        legacy()
    }
}

/// `PROPTEST_CASES` when set (a GPU hunt for rare interleavings, or Miri), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Model test: live allocations (address -> size) never overlap and stay inside the arena;
/// frees of live blocks succeed from either stream; wrong sizes and double frees are
/// reported and change nothing; out-of-memory only happens when the arena cannot hold the
/// request next to what is live; at the end everything is freed and the whole arena can
/// be allocated again.
fn run_model(ops: Vec<Op>) -> Result<(), TestCaseError> {
    const SIZE: usize = 16 * MIB;
    let trace = std::env::var_os("RMM_ARENA_MODEL_TRACE").is_some();
    let (mock, mr) = arena(SIZE);
    let start = base(&mr);
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    let mut freed: Option<(DevicePtr, usize)> = None;
    for op in ops {
        if trace {
            eprintln!("{op:?} freed={freed:?} live={live:?}\n{}", mr.memory_dump());
        }
        match op {
            Op::Alloc { bytes, per_thread } => {
                match mr.allocate(stream_of(per_thread), bytes, 256) {
                    Ok(p) => {
                        let rounded = bytes.div_ceil(256) * 256;
                        prop_assert!(p.is_aligned(256));
                        prop_assert!(p.addr() >= start);
                        prop_assert!(p.addr() + rounded as u64 <= start + SIZE as u64);
                        if let Some((&a, &s)) = live.range(..=p.addr()).next_back() {
                            prop_assert!(
                                a + s.div_ceil(256) as u64 * 256 <= p.addr(),
                                "overlaps the previous block"
                            );
                        }
                        if let Some((&a, _)) = live.range(p.addr()..).next() {
                            prop_assert!(p.addr() + rounded as u64 <= a, "overlaps the next block");
                        }
                        live.insert(p.addr(), bytes);
                        let new_block = (p.addr(), p.addr() + rounded as u64);
                        if freed.is_some_and(|(f, s)| {
                            f.addr() < new_block.1 && new_block.0 < f.addr() + s as u64
                        }) {
                            freed = None;
                        }
                    }
                    Err(e) => {
                        prop_assert!(e.is_out_of_memory(), "{}", e);
                        let used: usize = live.values().map(|s| s.div_ceil(256) * 256).sum();
                        prop_assert!(
                            used + bytes > SIZE / 4 || bytes > 16 * KIB,
                            "out of memory with {} live and {} requested",
                            used,
                            bytes
                        );
                    }
                }
            }
            Op::Free { pick, per_thread } => {
                if let Some((&a, &s)) = live.iter().nth(pick % live.len().max(1)) {
                    // SAFETY: a live block of `mr`, freed once.
                    let r = unsafe {
                        mr.deallocate(stream_of(per_thread), DevicePtr::from_raw(a), s, 256)
                    };
                    prop_assert!(r.is_ok(), "{:?}", r);
                    live.remove(&a);
                    freed = Some((DevicePtr::from_raw(a), s));
                }
            }
            Op::WrongSize { pick } => {
                if let Some((&a, &s)) = live.iter().nth(pick % live.len().max(1)) {
                    let wrong = s.div_ceil(256) * 256 + 256;
                    // SAFETY: a wrong free, which must be refused and change nothing.
                    let r = unsafe { mr.deallocate(legacy(), DevicePtr::from_raw(a), wrong, 256) };
                    prop_assert!(matches!(r, Err(MrError::InvalidFree { .. })), "{:?}", r);
                }
            }
            Op::DoubleFree => {
                if let Some((p, s)) = freed {
                    // SAFETY: a double free, which must be refused and change nothing.
                    let r = unsafe { mr.deallocate(legacy(), p, s, 256) };
                    prop_assert!(
                        matches!(
                            r,
                            Err(MrError::InvalidFree {
                                kind: InvalidFree::DoubleFree,
                                ..
                            })
                        ),
                        "{:?}",
                        r
                    );
                }
            }
        }
    }
    for (a, s) in std::mem::take(&mut live) {
        free(&mr, legacy(), DevicePtr::from_raw(a), s);
    }
    mr.inner.settle();
    let whole = alloc(&mr, per_thread(), SIZE);
    prop_assert_eq!(whole.addr(), start);
    free(&mr, per_thread(), whole, SIZE);
    drop(mr);
    prop_assert_eq!(mock.live_allocations(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]

    /// [`run_model`] on random operation sequences.
    #[test]
    fn model(ops in proptest::collection::vec(op(), 1..120)) {
        run_model(ops)?;
    }
}

/// A sequence the model found on a GPU (where frees from another stream wait for an event):
/// a double free of a block on the legacy stream, after its first free, was accepted.
#[test]
fn model_double_free_found_on_a_gpu() {
    use Op::{Alloc as A, DoubleFree as D, Free as F};
    let a = |bytes, per_thread| A { bytes, per_thread };
    let f = |pick, per_thread| F { pick, per_thread };
    let ops = vec![
        a(1, true),
        a(1048577, false),
        f(3341313058320109835, false),
        a(1219329, false),
        a(1, false),
        f(16570637951106246208, false),
        a(966145, false),
        a(1, false),
        a(1, false),
        a(48641, false),
        a(32513, false),
        a(1, false),
        f(369126496883673, false),
        a(1048577, true),
        a(2320641, false),
        a(1, false),
        a(1, false),
        a(1, true),
        f(632611335645542, false),
        a(1, false),
        f(532708787239677398, false),
        f(3852339775644502031, false),
        a(2057729, false),
        a(1, false),
        f(652866533479058006, false),
        a(356097, true),
        a(38145, true),
        a(1219585, false),
        a(11521, true),
        f(3351544876667835342, false),
        f(446664211333105303, false),
        a(1, false),
        f(1780687434280468154, false),
        f(10944033056462081, false),
        a(3143937, false),
        a(1884929, false),
        a(641537, true),
        a(641537, true),
        a(1, true),
        a(1129729, true),
        f(4114349547073293750, false),
        f(1856126316762278840, false),
        f(3115761099647827184, false),
        a(1, false),
        D,
    ];
    run_model(ops).unwrap();
}

// --- destroyed streams ----------------------------------------------------------------------

/// Streams of rmm-stream's simulated driver made by these tests: `STREAM_BASE + n`.
const STREAM_BASE: u32 = 0x00a2_0000;

/// Streams made, allocated on and destroyed one after the other (RMM: each keeps its arena in
/// the map until memory runs short; the arena here is large enough that it never does).
const STREAMS: u32 = 1_000;

/// The arenas of destroyed streams leave the map when the next arena is created: after
/// [`STREAMS`] streams, one arena in the map (the last stream's, destroyed but not yet swept)
/// and one holding arena of their superblocks. Then a reclaim gives everything back: the whole
/// arena is one free block.
///
/// Figure of `docs/reliability.md`: `cargo test -p rmm-mr --all-features --lib
/// arenas_of_destroyed_streams_do_not_pile_up -- --nocapture`.
#[test]
fn arenas_of_destroyed_streams_do_not_pile_up() {
    let _sim = rmm_sys::fault::FaultScope::simulated();
    let size = (STREAMS as usize + 64) * MIB;
    let (_mock, mr) = arena(size);
    let mut most = 0;
    for n in 0..STREAMS {
        let stream = rmm_stream::CudaStream::simulated(STREAM_BASE + n);
        let p = alloc(&mr, stream.view(), 4 * KIB);
        free(&mr, stream.view(), p, 4 * KIB);
        drop(stream);
        let s = snapshot(&mr);
        most = most.max(s.arenas + s.holding);
    }
    let s = snapshot(&mr);
    eprintln!(
        "arenas alive after {STREAMS} destroyed streams: {} (at most {most} at any time): {} in \
         the map, {} holding",
        s.arenas + s.holding,
        s.arenas,
        s.holding
    );
    assert!(
        s.arenas + s.holding <= 2 && most <= 2,
        "{s:?}, at most {most}"
    );
    // The destroyed streams' superblocks are not lost: a reclaim gives them back.
    mr.inner.reclaim_now().unwrap();
    let s = snapshot(&mr);
    assert_eq!((s.lent_superblocks, s.holding), (0, 0), "{s:?}");
    assert!(s.fully_coalesced, "{s:?}");
    let all = alloc(&mr, legacy(), size);
    free(&mr, legacy(), all, size);
}

/// A block allocated on a stream that is then destroyed can still be freed on another stream
/// (from the holding arena, then from the global arena once a reclaim took its superblock
/// back), and wrong frees of it are still reported; afterwards the whole arena is free.
#[test]
fn blocks_of_destroyed_streams_can_still_be_freed() {
    let _sim = rmm_sys::fault::FaultScope::simulated();
    let size = 64 * MIB;
    let (_mock, mr) = arena(size);
    let a = rmm_stream::CudaStream::simulated(STREAM_BASE + STREAMS + 1);
    let p = alloc(&mr, a.view(), 4 * KIB);
    let q = alloc(&mr, a.view(), 8 * KIB);
    let big = alloc(&mr, a.view(), 3 * MIB);
    // A large block served by a superblock the stream's arena kept from its own large free.
    let kept = alloc(&mr, a.view(), 2 * MIB);
    free(&mr, a.view(), kept, 2 * MIB);
    let kept = alloc(&mr, a.view(), 2 * MIB);
    assert_eq!(
        snapshot(&mr).large_live,
        1,
        "the test needs a kept superblock"
    );
    fill(q, 8 * KIB, 0x5a);
    drop(a);
    let b = rmm_stream::CudaStream::simulated(STREAM_BASE + STREAMS + 2);
    // A new arena: the destroyed stream's leaves the map.
    let r = alloc(&mr, b.view(), 4 * KIB);
    let s = snapshot(&mr);
    assert_eq!((s.arenas, s.holding), (1, 1), "{s:?}");
    assert!(holds(q, 8 * KIB, 0x5a), "a live block was handed out again");
    free(&mr, b.view(), p, 4 * KIB);
    assert_eq!(
        kind(&try_free(&mr, b.view(), p, 4 * KIB)),
        InvalidFree::DoubleFree
    );
    free(&mr, b.view(), kept, 2 * MIB);
    assert_eq!(
        kind(&try_free(&mr, b.view(), kept, 2 * MIB)),
        InvalidFree::DoubleFree
    );
    assert!(matches!(
        kind(&try_free(&mr, b.view(), q, 4 * KIB)),
        InvalidFree::SizeMismatch { .. }
    ));
    // The reclaim gives the holding arena's superblocks back, `q` still live in them.
    mr.inner.reclaim_now().unwrap();
    let s = snapshot(&mr);
    assert_eq!((s.arenas, s.holding), (1, 0), "{s:?}");
    assert!(holds(q, 8 * KIB, 0x5a), "a live block was handed out again");
    free(&mr, b.view(), q, 8 * KIB);
    mr.inner.settle();
    assert_eq!(
        kind(&try_free(&mr, b.view(), q, 8 * KIB)),
        InvalidFree::DoubleFree
    );
    free(&mr, b.view(), big, 3 * MIB);
    free(&mr, b.view(), r, 4 * KIB);
    drop(b);
    reclaim_gives_everything_back(&mr, size);
}

/// Threads make, use and destroy streams concurrently, pass blocks to each other to free on
/// their own streams (often after the allocating stream was destroyed) and reclaim now and
/// then: no live block is ever handed out again, every free succeeds, the arenas stay few,
/// and at the end the whole arena is free.
#[test]
fn streams_die_while_other_threads_free_their_blocks() {
    const THREADS: u32 = 4;
    const ROUNDS: u32 = 150;
    let _sim = rmm_sys::fault::FaultScope::simulated();
    let size = 64 * MIB;
    let (_mock, mr) = arena(size);
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(u64, usize, u64)>())
        .unzip();
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, inbox)| {
            let t = t as u32;
            let mr = mr.clone();
            let next = senders[((t + 1) % THREADS) as usize].clone();
            std::thread::spawn(move || {
                let _sim = rmm_sys::fault::FaultScope::simulated();
                let mut rng = Rng::new(0x9E37_79B9 + u64::from(t));
                for i in 0..ROUNDS {
                    let n = STREAM_BASE + 0x1_0000 + t * 0x1000 + i;
                    let stream = rmm_stream::CudaStream::simulated(n);
                    let tag = u64::from(n);
                    let mine = 256 * (1 + rng.below(64));
                    let passed = 256 * (1 + rng.below(64));
                    let p = alloc(&mr, stream.view(), mine);
                    let q = alloc(&mr, stream.view(), passed);
                    fill_tag(p, mine, tag);
                    fill_tag(q, passed, tag);
                    next.send((q.addr(), passed, tag)).unwrap();
                    while let Ok((addr, bytes, tag)) = inbox.try_recv() {
                        let ptr = DevicePtr::from_raw(addr);
                        assert!(
                            holds_tag(ptr, bytes, tag),
                            "a live block was handed out again"
                        );
                        free(&mr, stream.view(), ptr, bytes);
                    }
                    assert!(holds_tag(p, mine, tag), "a live block was handed out again");
                    free(&mr, stream.view(), p, mine);
                    drop(stream);
                    if i % 37 == 36 {
                        mr.inner.reclaim_now().unwrap();
                    }
                }
                drop(next);
                inbox
            })
        })
        .collect();
    drop(senders);
    let inboxes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for inbox in inboxes {
        for (addr, bytes, tag) in inbox.iter() {
            let ptr = DevicePtr::from_raw(addr);
            assert!(
                holds_tag(ptr, bytes, tag),
                "a live block was handed out again"
            );
            free(&mr, legacy(), ptr, bytes);
        }
    }
    let s = snapshot(&mr);
    assert!(
        s.arenas <= THREADS as usize + 1 && s.holding <= 1,
        "arenas of destroyed streams pile up: {s:?}"
    );
    reclaim_gives_everything_back(&mr, size);
}

/// Once every block is freed: after the pending frees settle and a reclaim, nothing is lent,
/// held or pending, the arena is one free block again, and all of it (`size` bytes) can be
/// allocated at once.
fn reclaim_gives_everything_back(mr: &Arena, size: usize) {
    mr.inner.settle();
    mr.inner.reclaim_now().unwrap();
    let s = snapshot(mr);
    assert_eq!(
        (s.lent_superblocks, s.holding, s.pending),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(s.fully_coalesced, "{s:?}");
    let all = alloc(mr, legacy(), size);
    free(mr, legacy(), all, size);
}

/// What [`watch_locks`] saw: each synchronization's entry point and the locks held then.
type Watched = Rc<RefCell<Vec<(&'static str, Vec<String>)>>>;

/// Watches this thread's synchronizations (device, stream, event) and records, at each, the
/// locks of `mr` held at that moment: none may be.
fn watch_locks(mr: &Arena) -> Watched {
    let state = std::sync::Arc::clone(&mr.inner);
    let seen = Watched::default();
    let log = Rc::clone(&seen);
    fault::watch(DriverCall::Synchronize, move |call| {
        log.borrow_mut().push((call, state.locks_held()));
    });
    seen
}

/// Making room synchronizes the device (under rmm-sys's simulated driver, as on a GPU) with no
/// lock of the resource held, the reclaim and the defragmentation alike (RMM defragments
/// holding its exclusive lock; so did this resource, holding the map, every arena and the
/// global arena across the synchronization).
#[test]
fn no_lock_is_held_while_making_room_synchronizes() {
    let _sim = FaultScope::simulated();
    let (_mock, mr) = arena(4 * MIB);
    // Four superblocks, one block each; the second one emptied.
    let blocks: Vec<DevicePtr> = (0..4).map(|_| alloc(&mr, legacy(), 600 * KIB)).collect();
    free(&mr, legacy(), blocks[1], 600 * KIB);
    let seen = watch_locks(&mr);
    let syncs = fault::calls(DriverCall::Synchronize);
    // More than the emptied superblock: a reclaim is not enough, the defragmentation dissolves
    // the first superblock around its live block.
    let big = alloc(&mr, legacy(), 1200 * KIB);
    fault::unwatch(DriverCall::Synchronize);
    assert_eq!(big.addr(), blocks[0].addr() + 600 * KIB as u64);
    assert!(
        fault::calls(DriverCall::Synchronize) >= syncs + 2,
        "the reclaim and the defragmentation each synchronize"
    );
    let seen = seen.borrow();
    assert!(!seen.is_empty());
    for (call, held) in seen.iter() {
        assert!(held.is_empty(), "{call} with {held:?} locked");
    }
    let s = snapshot(&mr);
    assert_eq!(
        (s.arenas, s.holding, s.lent_superblocks),
        (0, 0, 0),
        "{s:?}"
    );
    free(&mr, legacy(), big, 1200 * KIB);
    for &p in [blocks[0], blocks[2], blocks[3]].iter() {
        free(&mr, per_thread(), p, 600 * KIB);
    }
    reclaim_gives_everything_back(&mr, 4 * MIB);
}

/// While a defragmentation waits for the device, other threads free blocks of the superblocks
/// it took (from the block's stream and from a per-thread default stream) and allocate: no
/// lock is held, nothing is handed out twice, and the frees count once the superblocks are
/// back.
#[test]
fn streams_free_and_allocate_while_a_defragmentation_waits() {
    let _sim = FaultScope::simulated();
    let (_mock, mr) = arena(4 * MIB);
    let a = alloc(&mr, legacy(), 256 * KIB);
    let b = alloc(&mr, legacy(), 256 * KIB);
    let (in_sync_tx, in_sync_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let c = std::thread::scope(|sc| {
        let defragmenting = sc.spawn(|| {
            let _sim = FaultScope::simulated();
            fault::watch(DriverCall::Synchronize, move |_| {
                let _ = in_sync_tx.send(());
                let _ = go_rx.recv();
            });
            let r = mr.inner.defragment_now();
            fault::unwatch(DriverCall::Synchronize);
            r
        });
        in_sync_rx
            .recv()
            .expect("the defragmentation never synchronized");
        let held = mr.inner.locks_held();
        assert!(
            held.is_empty(),
            "{held:?} locked while the device is synchronized"
        );
        // Every arena retired, its superblock still lent (to the holding arena the reclaim
        // took out before the synchronization).
        let s = snapshot(&mr);
        assert_eq!((s.arenas, s.lent_superblocks), (0, 1), "{s:?}");
        // The block's own stream frees one, the per-thread stream the other (ordered behind
        // the legacy stream: the block's next user may be any stream).
        free(&mr, legacy(), b, 256 * KIB);
        let records = fault::calls(DriverCall::EventRecord);
        free(&mr, per_thread(), a, 256 * KIB);
        assert_eq!(
            fault::calls(DriverCall::EventRecord),
            records + 2,
            "one fence on the freeing stream, then one on the legacy stream"
        );
        assert_eq!(
            kind(&try_free(&mr, legacy(), b, 256 * KIB)),
            InvalidFree::DoubleFree
        );
        // A fresh legacy arena serves from memory the defragmentation did not take.
        let c = alloc(&mr, legacy(), 256 * KIB);
        assert!(c.addr() >= a.addr() + MIB as u64, "handed out a held block");
        go_tx.send(()).unwrap();
        // The reclaim's later waits (for the fences the frees left) go on at once.
        drop(go_tx);
        defragmenting.join().unwrap().unwrap();
        c
    });
    let s = snapshot(&mr);
    assert_eq!(s.holding, 0, "{s:?}");
    assert_eq!(mr.inner.live_blocks(), vec![(c.addr(), 256 * KIB)]);
    free(&mr, legacy(), c, 256 * KIB);
    reclaim_gives_everything_back(&mr, 4 * MIB);
}

mod faults {
    //! Fault injection into the arena resource, with the harness of [`crate::testing::faults`]: under
    //! rmm-sys's simulated driver the arena records and waits on events as on a GPU, so event
    //! creation, records, waits, queries and synchronizations can fail at any step; after every
    //! failed call the blocks handed out (every live block of every superblock, but those whose free
    //! is pending) and the mock's live set must be as before it.

    use super::{ArenaMemoryResource, ArenaOptions};
    use crate::testing::faults::{driver_faults, expect, sweep, Faulty, Subject, STREAM_CALLS};
    use crate::testing::{FaultKind, FaultyResource, HostMockResource};
    use rmm_sys::fault::{DriverCall, FaultScope};

    const MIB: usize = 1 << 20;

    fn subject<'a>(
        name: &'static str,
        mr: &'a ArenaMemoryResource<Faulty>,
        faulty: &'a Faulty,
        mock: &'a HostMockResource,
        stream_count: usize,
    ) -> Subject<'a> {
        let mut faults = driver_faults(&STREAM_CALLS);
        faults.extend(driver_faults(&[DriverCall::Query]));
        Subject {
            name,
            mr,
            faulty,
            mock,
            state: Box::new(|| format!("{:?}", mr.inner.live_blocks())),
            memory: None,
            check: Box::new(move |live| {
                let mut want: Vec<u64> = live.iter().map(|l| l.ptr.addr()).collect();
                want.sort_unstable();
                let got: Vec<u64> = mr.inner.live_blocks().iter().map(|&(a, _)| a).collect();
                expect("blocks handed out", got, want)?;
                expect("upstream allocations", mock.live_allocations(), 1)
            }),
            faults,
            max_bytes: 3 * MIB / 2,
            alignments: &[256],
            stream_count,
            mismatch_frees: false,
            maintain: None,
            maintenance: 0,
            writer: None,
        }
    }

    #[test]
    fn arena() {
        sweep(
            "arena",
            |f| {
                ArenaMemoryResource::with_options(
                    f.clone(),
                    ArenaOptions::new().arena_size(16 * MIB),
                )
            },
            |mr, faulty, mock| subject("arena", mr, faulty, mock, 4),
        );
    }

    #[test]
    fn a_refused_arena_allocation_leaves_nothing_behind() {
        let _sim = FaultScope::simulated();
        for kind in FaultKind::ALL {
            let mock = HostMockResource::new();
            let faulty = FaultyResource::new(mock.clone());
            faulty.fail_next_allocation(kind);
            let e = ArenaMemoryResource::with_options(
                faulty.clone(),
                ArenaOptions::new().arena_size(4 * MIB),
            )
            .unwrap_err();
            assert!(kind.matches(&e), "{kind:?}: {e}");
            assert_eq!(mock.live_allocations(), 0);
        }
        // The arena's upstream allocation is synchronized (as on a GPU): when that fails, the
        // memory goes back.
        let mock = HostMockResource::new();
        rmm_sys::fault::inject(rmm_sys::fault::Fault::next(DriverCall::Synchronize));
        assert!(ArenaMemoryResource::with_options(
            mock.clone(),
            ArenaOptions::new().arena_size(4 * MIB)
        )
        .is_err());
        assert_eq!(mock.live_allocations(), 0);
    }
}
