//! The pool resource (RMM's `pool_memory_resource`).

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{MrError, MrResult};
use crate::pool::engine::{Growth, Pool, Separate};
use crate::pool::growth::{check_sizes, size_to_grow, size_under_pressure, try_to_expand};
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::stream_ordered::accept_chunk;
use crate::stream_ordered::core::{Expand, GrowthCause, StreamLists};

/// The pool's source of chunks: separate chunks from the upstream, sized by RMM's growth
/// policy.
struct FromUpstream<U: DeviceMemoryResource> {
    upstream: U,
    /// The maximum pool size, if any.
    maximum: Option<usize>,
}

impl<U: DeviceMemoryResource> Growth for FromUpstream<U> {
    const NAME: &'static str = NAME;
    type Layout = Separate;

    fn source(&self) -> &dyn DeviceMemoryResource {
        &self.upstream
    }

    fn release_limit(&self) -> Option<usize> {
        self.maximum
    }

    /// RMM's `expand_pool`: one new upstream chunk of `size_to_grow` bytes, halved on failure
    /// down to `size`, on `stream`; under pressure (a fitting block waits on its owner's event)
    /// just `size` ([`size_under_pressure`]). Chunks never merge, so the tail is 0.
    fn grow(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        size: usize,
        ask: Expand,
    ) -> MrResult<(DevicePtr, usize)> {
        let try_size = match ask.cause {
            GrowthCause::Ordinary => size_to_grow(ask.pool_size, size, self.maximum),
            GrowthCause::Pressure => size_under_pressure(ask.pool_size, size, self.maximum),
        };
        self.chunk(stream, bytes, try_size, size, ask.pool_size)
    }
}

impl<U: DeviceMemoryResource> FromUpstream<U> {
    /// RMM's `try_to_expand` against the upstream: the first size of the halving plan from
    /// `try_size` down to `min_size` the upstream grants, for a pool of `pool_size` bytes.
    /// Failure is out-of-memory with RMM's message, except that a missing driver or device
    /// stays that error.
    fn chunk(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        try_size: usize,
        min_size: usize,
        pool_size: usize,
    ) -> MrResult<(DevicePtr, usize)> {
        let upstream = &self.upstream;
        // Refused under a capture not begun through a `GraphPool` (cuMemAlloc would invalidate it).
        let grown = crate::graph::growth(stream, bytes, || {
            Ok(try_to_expand(
                try_size,
                min_size,
                pool_size,
                self.maximum,
                |s| upstream.allocate(stream, s, ALLOCATION_ALIGNMENT),
            ))
        })?;
        match grown {
            // SAFETY: the upstream just handed out this chunk on `stream` for `size` bytes.
            Ok((chunk, size)) => unsafe { accept_chunk(upstream, stream, chunk, size, NAME) }
                .map(|chunk| (chunk, size)),
            Err((_, Some(e))) if e.is_no_device() => Err(e),
            Err((oom, _)) => {
                log::error!("rmm: pool_memory_resource: {oom}");
                Err(MrError::out_of_memory(bytes, oom))
            }
        }
    }
}

/// The name in messages.
const NAME: &str = "pool_memory_resource";

/// How to build a [`PoolMemoryResource`] (RMM's constructor parameters).
///
/// Built with [`new`](Self::new) (the initial size is required, as in RMM) and the chained
/// setters; the fields are public to read. `#[non_exhaustive]`: later options do not break
/// callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolOptions {
    /// Bytes taken from the upstream at construction, a multiple of 256 (0: grow on first
    /// use).
    pub initial_pool_size: usize,
    /// The most bytes the pool takes from its upstream, a multiple of 256 and at least the
    /// initial size. `None` (RMM's default): grow until the upstream refuses.
    pub maximum_pool_size: Option<usize>,
}

impl PoolOptions {
    /// RMM's defaults for a pool of `initial_pool_size` bytes: no maximum.
    #[must_use]
    pub fn new(initial_pool_size: usize) -> Self {
        Self {
            initial_pool_size,
            maximum_pool_size: None,
        }
    }

    /// Sets the field `initial_pool_size`.
    #[must_use]
    pub fn initial_pool_size(mut self, bytes: usize) -> Self {
        self.initial_pool_size = bytes;
        self
    }

    /// Sets the field `maximum_pool_size` to `Some(bytes)`.
    #[must_use]
    pub fn maximum_pool_size(mut self, bytes: usize) -> Self {
        self.maximum_pool_size = Some(bytes);
        self
    }
}

/// A coalescing best-fit sub-allocator with per-stream free lists (RMM's
/// `pool_memory_resource`). It takes large chunks from its upstream and carves allocations out
/// of them, stream-ordered: memory freed on one stream is reused on another only after that
/// stream waits for the first (an event), never by blocking the host.
///
/// # Semantics (RMM's, exactly)
///
/// - [`with_options`](Self::with_options) checks that both sizes are multiples of 256 and that the initial size
///   does not exceed the maximum (RMM's messages, as [`MrError::InvalidArgument`]); a non-zero
///   initial size is one upstream chunk of exactly that size, obtained on the legacy stream
///   (failure: out-of-memory).
/// - `allocate(_, 0, _)` is [`DevicePtr::NULL`] and touches nothing; sizes are rounded up to
///   256. Beyond RMM (which ignores the alignment argument), an alignment above 256 is
///   honoured up to [`MAX_OVER_ALIGNMENT`](crate::MAX_OVER_ALIGNMENT) by taking a block
///   `alignment - 256` bytes larger, and refused above it (see the trait's "Alignment"); an
///   upstream chunk that is not 256-aligned is given back and refused.
/// - A request is served from this stream's list (best fit, ties to the lowest address), else by
///   stealing one block from another stream's list, else by merging other lists into this one,
///   else by growing: without a maximum the pool at least doubles; with one, it takes half the
///   remaining headroom (or the request, if larger); a refused chunk is halved down to the
///   request; failure is out-of-memory `"Maximum pool size exceeded (failed to allocate X): ..."`.
/// - Blocks of different upstream chunks never coalesce. [`pool_size`](Self::pool_size) is the
///   sum of the chunks. Dropping the pool returns every chunk, allocations outstanding or not.
/// - Copies share the pool and are equal; two pools are unequal.
///
/// # Differences from RMM
///
/// - **Scales with threads**: a lock per stream list and lazy events (recorded only when another
///   stream takes or asks for a list's blocks) instead of one mutex and an event per free; a
///   thief never uses a block before the work queued before its free has completed, but it may
///   grow the pool once where RMM would have taken a block.
/// - **Best fit in size classes and coalescing through boundary tags** (O(1) expected to find
///   a freed block's neighbours, where RMM's address-ordered list is linear; the same blocks as
///   the ordered `CoalescingFreeList`).
/// - **Wrong frees are errors**: a free of an unknown pointer, a double free or a size mismatch
///   is [`MrError::InvalidFree`] (RMM corrupts its lists or aborts).
/// - [`release_unused`](Self::release_unused) gives wholly free chunks back to the upstream
///   (RMM's pool never shrinks).
/// - **Gives free chunks back before it fails**: when a pool with a maximum cannot grow for a
///   request of at most its maximum, it (having merged every stream's list and reclaimed the
///   blocks no event covers) releases its wholly free chunks to the upstream, after a device
///   synchronization, and tries to grow once more, now by one chunk of the request if need
///   be. So free memory split over chunks that never merge (RMM issues 496, 1957 and 2039's
///   "out of memory with gigabytes free") still serves a large request once it is free; RMM's
///   pool fails it. The pool is then smaller than before. Without a maximum (the upstream
///   refused) or for a larger request, a failed allocation changes nothing.
/// - A per-thread default stream has one list per host thread *per pool*; a block allocated on
///   one thread's per-thread stream and freed on another's goes to the legacy stream's list, so
///   it is reused only after both threads' work (RMM lets the freeing thread reuse it at once).
///
/// Why and how, with the lock order: `docs/internals/pool.md` and
/// `docs/internals/stream-ordered.md`.
#[doc(alias = "rmm::mr::pool_memory_resource")]
pub struct PoolMemoryResource<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Pool<FromUpstream<U>>>,
}

impl<U: DeviceMemoryResource> Clone for PoolMemoryResource<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> PoolMemoryResource<U> {
    /// A pool over `upstream` starting with `initial_pool_size` bytes (0: grow on first use)
    /// and growing until the upstream refuses (RMM's constructor with its default maximum).
    ///
    /// # Errors
    ///
    /// As [`with_options`](Self::with_options).
    pub fn new(upstream: U, initial_pool_size: usize) -> MrResult<Self> {
        Self::with_options(upstream, PoolOptions::new(initial_pool_size))
    }

    /// A pool over `upstream` built with `options` (see [`PoolOptions`]).
    ///
    /// # Errors
    ///
    /// [`MrError::InvalidArgument`] when a size is not a multiple of 256 or the initial size
    /// exceeds the maximum; [`MrError::OutOfMemory`] when the upstream refuses the initial
    /// chunk.
    pub fn with_options(upstream: U, options: PoolOptions) -> MrResult<Self> {
        let (initial, maximum) = (options.initial_pool_size, options.maximum_pool_size);
        check_sizes(initial, maximum).map_err(MrError::invalid_argument)?;
        let pool = Pool::new(FromUpstream { upstream, maximum }, Separate);
        if initial > 0 {
            let (ptr, size) =
                pool.growth
                    .chunk(CudaStreamView::legacy(), initial, initial, initial, 0)?;
            pool.core.add_initial_chunk(ptr, size)?;
        }
        Ok(Self {
            inner: Arc::new(pool),
        })
    }

    /// Bytes obtained from the upstream (the sum of the chunks), RMM's `pool_size()`.
    #[must_use]
    pub fn pool_size(&self) -> usize {
        self.inner.core.pool_size()
    }

    /// The maximum pool size, if any.
    #[must_use]
    pub fn maximum_pool_size(&self) -> Option<usize> {
        self.inner.growth.maximum
    }

    /// The upstream resource (RMM's `get_upstream_resource()`).
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.growth.upstream
    }

    /// Number of allocations handed out and not yet freed.
    #[must_use]
    pub fn outstanding_allocations(&self) -> usize {
        self.inner.core.outstanding()
    }

    /// How long growers held this resource's growth lock so far (each hold: the search, the
    /// waits for frees and merges to land, the upstream call). With the `testing`
    /// feature only; `gpu_alloc` prints it.
    #[cfg(any(test, feature = "testing"))]
    #[must_use]
    pub fn growth_lock_holds(&self) -> crate::testing::GrowthLockHolds {
        self.inner.core.growth_lock_holds()
    }

    /// Gives every upstream chunk that is wholly free back to the upstream and returns the
    /// bytes released (beyond RMM, whose pool never shrinks). The device is synchronized first,
    /// so no pending work on any stream can still use the memory. Chunks with an allocation
    /// outstanding stay.
    ///
    /// # Errors
    ///
    /// A failed synchronization (nothing is released) or the first failed upstream
    /// deallocation (the chunks the upstream refused stay in the pool, the others are released).
    pub fn release_unused(&self) -> MrResult<usize> {
        self.inner.release_unused()
    }
}

/// How many stream lists `pool` keeps; with `retire`, after retiring those whose owner died
/// since the last look (for tests and figures, through `rmm_mr::__internals`).
pub fn stream_lists<U: DeviceMemoryResource>(
    pool: &PoolMemoryResource<U>,
    retire: bool,
) -> StreamLists {
    pool.inner.core.stream_lists(retire)
}

impl<U: DeviceMemoryResource> fmt::Debug for PoolMemoryResource<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolMemoryResource")
            .field("pool_size", &self.pool_size())
            .field("maximum_pool_size", &self.maximum_pool_size())
            .field("core", &self.inner.core)
            .field("upstream", &self.inner.growth.upstream)
            .finish()
    }
}

// SAFETY: blocks are disjoint, 256-byte aligned sub-ranges of chunks the upstream (bound by
// this trait's contract) handed out and this resource holds until it is dropped; a block is
// handed out again only after it was freed, ordered after the freeing stream's work.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for PoolMemoryResource<U> {
    #[inline]
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        self.inner.allocate(stream, bytes, alignment)
    }

    crate::resource::resource_tail! {
        deallocate: forward(inner),
        is_equal: shared(inner),
        properties: forward(inner.growth.upstream),
        snapshot: forward(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::InvalidFree;
    use crate::resource::{resource_cast, shared};
    use crate::testing::HostMockResource;
    use crate::LimitingResourceAdaptor;
    use proptest::prelude::*;

    impl<U: DeviceMemoryResource> PoolMemoryResource<U> {
        /// Everything the pool's core keeps.
        pub(crate) fn core_state(&self) -> crate::stream_ordered::core::tests::CoreState {
            self.inner.core.state()
        }
    }

    /// The legacy default stream: its list needs no CUDA call, in either default-stream mode.
    fn s() -> CudaStreamView<'static> {
        CudaStreamView::legacy()
    }

    fn pool(
        initial: usize,
        maximum: Option<usize>,
    ) -> (PoolMemoryResource<HostMockResource>, HostMockResource) {
        let mock = HostMockResource::new();
        (
            PoolMemoryResource::with_options(
                mock.clone(),
                PoolOptions {
                    initial_pool_size: initial,
                    maximum_pool_size: maximum,
                },
            )
            .unwrap(),
            mock,
        )
    }

    fn invalid_free_kind(r: MrResult<()>) -> InvalidFree {
        match r {
            Err(MrError::InvalidFree { kind, .. }) => kind,
            other => panic!("expected an invalid free, got {other:?}"),
        }
    }

    /// Fills `[ptr, ptr + len)` of host memory with `byte`.
    ///
    /// # Safety
    /// The range is host memory owned by the caller.
    unsafe fn fill(ptr: DevicePtr, len: usize, byte: u8) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_bytes(ptr.as_host_ptr::<u8>(), byte, len) };
    }

    /// Whether every byte of `[ptr, ptr + len)` is `byte`.
    ///
    /// # Safety
    /// The range is host memory owned by the caller.
    unsafe fn holds(ptr: DevicePtr, len: usize, byte: u8) -> bool {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(ptr.as_host_ptr::<u8>(), len) }
            .iter()
            .all(|&b| b == byte)
    }

    #[test]
    fn constructor_validates_like_rmm() {
        let mock = HostMockResource::new();
        let msg = |r: MrResult<PoolMemoryResource<HostMockResource>>| match r {
            Err(MrError::InvalidArgument(m)) => m,
            other => panic!("expected an invalid argument, got {other:?}"),
        };
        assert_eq!(
            msg(PoolMemoryResource::new(mock.clone(), 1000)),
            "Error, Initial pool size required to be a multiple of 256 bytes"
        );
        assert_eq!(
            msg(PoolMemoryResource::with_options(
                mock.clone(),
                PoolOptions::new(1024).maximum_pool_size(1000)
            )),
            "Error, Maximum pool size required to be a multiple of 256 bytes"
        );
        assert_eq!(
            msg(PoolMemoryResource::with_options(
                mock.clone(),
                PoolOptions::new(2048).maximum_pool_size(1024)
            )),
            "Initial pool size exceeds the maximum pool size!"
        );
        assert_eq!(mock.allocation_calls(), 0);

        let lazy = PoolMemoryResource::new(mock.clone(), 0).unwrap();
        assert_eq!((lazy.pool_size(), mock.allocation_calls()), (0, 0));
        let equal = PoolMemoryResource::with_options(
            mock.clone(),
            PoolOptions::new(1024).maximum_pool_size(1024),
        )
        .unwrap();
        assert_eq!(equal.pool_size(), 1024);
        assert_eq!(equal.maximum_pool_size(), Some(1024));
        assert_eq!((mock.allocation_calls(), mock.live_bytes()), (1, 1024));
        assert_eq!(mock.last_alignment(), 256);
        drop(equal);
        assert_eq!(mock.live_allocations(), 0);

        mock.fail_next_allocations(1);
        let e = PoolMemoryResource::new(mock.clone(), 4096).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(
            e.to_string()
                .contains("Maximum pool size exceeded (failed to allocate 4.000000 KiB)"),
            "{e}"
        );
    }

    #[test]
    fn zero_bytes_and_null_touch_nothing() {
        let (p, mock) = pool(0, None);
        assert_eq!(p.allocate(s(), 0, 256).unwrap(), DevicePtr::NULL);
        assert_eq!(mock.allocation_calls(), 0);
        let a = p.allocate(s(), 512, 256).unwrap();
        // SAFETY: null and zero-byte frees are no-ops; `a` stays allocated.
        unsafe {
            p.deallocate(s(), DevicePtr::NULL, 512, 256).unwrap();
            p.deallocate(s(), a, 0, 256).unwrap();
        }
        assert_eq!(p.outstanding_allocations(), 1);
        // SAFETY: `a` came from `p` with 512 bytes.
        unsafe { p.deallocate(s(), a, 512, 256).unwrap() };
        assert_eq!(p.outstanding_allocations(), 0);
    }

    #[test]
    fn rounds_to_256_and_reuses_freed_blocks() {
        let (p, mock) = pool(4096, None);
        let a = p.allocate(s(), 1, 256).unwrap();
        let b = p.allocate(s(), 1, 0).unwrap();
        let c = p.allocate(s(), 300, 64).unwrap();
        assert!(a.is_aligned(256) && b.is_aligned(256) && c.is_aligned(256));
        assert_eq!(b.addr(), a.addr() + 256);
        assert_eq!(c.addr(), b.addr() + 256);
        // SAFETY: `b` came from `p` with 1 byte.
        unsafe { p.deallocate(s(), b, 1, 256).unwrap() };
        // Best fit: the 256-byte hole, not the large tail.
        assert_eq!(p.allocate(s(), 200, 256).unwrap(), b);
        assert_eq!(mock.allocation_calls(), 1, "the pool grew needlessly");
        assert_eq!(p.pool_size(), 4096);
    }

    #[test]
    fn freed_blocks_coalesce_back_into_the_chunk() {
        let (p, mock) = pool(1 << 16, None);
        let blocks: Vec<DevicePtr> = (0..16)
            .map(|_| p.allocate(s(), 4096, 256).unwrap())
            .collect();
        let base = blocks.iter().map(|b| b.addr()).min().unwrap();
        // Free in a scrambled order.
        for i in [5, 0, 15, 7, 1, 14, 2, 9, 3, 12, 4, 8, 6, 11, 10, 13] {
            // SAFETY: each block came from `p` with 4096 bytes and is freed once.
            unsafe { p.deallocate(s(), blocks[i], 4096, 256).unwrap() };
        }
        let whole = p.allocate(s(), 1 << 16, 256).unwrap();
        assert_eq!(whole.addr(), base);
        assert_eq!(mock.allocation_calls(), 1);
        // SAFETY: `whole` came from `p`.
        unsafe { p.deallocate(s(), whole, 1 << 16, 256).unwrap() };
    }

    #[test]
    fn blocks_of_different_chunks_never_merge() {
        let (p, mock) = pool(0, None);
        let a = p.allocate(s(), 1024, 256).unwrap();
        let b = p.allocate(s(), 1024, 256).unwrap();
        assert_eq!((p.pool_size(), mock.allocation_calls()), (2048, 2));
        // SAFETY: both came from `p` with 1024 bytes.
        unsafe {
            p.deallocate(s(), a, 1024, 256).unwrap();
            p.deallocate(s(), b, 1024, 256).unwrap();
        }
        let c = p.allocate(s(), 2048, 256).unwrap();
        assert_eq!(p.pool_size(), 4096);
        assert_eq!(mock.allocation_calls(), 3, "two chunks served one block");
        assert_eq!(p.pool_size(), 4096);
        // SAFETY: `c` came from `p`.
        unsafe { p.deallocate(s(), c, 2048, 256).unwrap() };
    }

    /// RMM's `PoolTest.ForceGrowth`, without a maximum pool size (section 2.3).
    #[test]
    fn force_growth_unbounded() {
        let mock = HostMockResource::new();
        let limited = LimitingResourceAdaptor::new(mock.clone(), 6000);
        let p = PoolMemoryResource::new(limited.clone(), 0).unwrap();
        let a = p.allocate(s(), 1000, 256).unwrap();
        assert_eq!(p.pool_size(), 1024);
        let b = p.allocate(s(), 4000, 256).unwrap();
        assert_eq!(p.pool_size(), 1024 + 4096);
        let c = p.allocate(s(), 500, 256).unwrap();
        // 5120, 2560 and 1280 were refused, 640 granted.
        assert_eq!(p.pool_size(), 1024 + 4096 + 640);
        assert_eq!((mock.live_allocations(), mock.live_bytes()), (3, 5760));
        // The limiting adaptor counts the 640-byte chunk as 768.
        assert_eq!(limited.allocated_bytes(), 1024 + 4096 + 768);
        let e = p.allocate(s(), 2000, 256).unwrap_err();
        assert!(e.is_out_of_memory());
        assert!(
            e.to_string().starts_with(
                "std::bad_alloc: out_of_memory: Maximum pool size exceeded (failed to allocate \
                 2.000000 KiB): "
            ),
            "{e}"
        );
        assert!(e.to_string().contains("Exceeded memory limit"), "{e}");
        assert_eq!(p.pool_size(), 5760);
        // SAFETY: all three came from `p` with these sizes.
        unsafe {
            p.deallocate(s(), a, 1000, 256).unwrap();
            p.deallocate(s(), b, 4000, 256).unwrap();
            p.deallocate(s(), c, 500, 256).unwrap();
        }
        drop(p);
        assert_eq!((mock.live_allocations(), limited.allocated_bytes()), (0, 0));
    }

    /// RMM's `PoolTest.ForceGrowth`, with a maximum pool size of 8192 (section 2.3).
    #[test]
    fn force_growth_bounded() {
        let mock = HostMockResource::new();
        let limited = LimitingResourceAdaptor::new(mock.clone(), 6000);
        let p =
            PoolMemoryResource::with_options(limited, PoolOptions::new(0).maximum_pool_size(8192))
                .unwrap();
        let a = p.allocate(s(), 1000, 256).unwrap();
        assert_eq!(p.pool_size(), 4096, "half of the headroom");
        assert!(p.allocate(s(), 4000, 256).unwrap_err().is_out_of_memory());
        let b = p.allocate(s(), 500, 256).unwrap();
        let c = p.allocate(s(), 2000, 256).unwrap();
        assert_eq!(p.pool_size(), 4096);
        assert_eq!(mock.live_allocations(), 1);
        // The remaining headroom (4096) cannot hold 8192 bytes: no upstream call at all.
        let calls = mock.allocation_calls();
        let e = p.allocate(s(), 8192, 256).unwrap_err();
        assert_eq!(mock.allocation_calls(), calls);
        assert_eq!(
            e.to_string(),
            "std::bad_alloc: out_of_memory: Maximum pool size exceeded (failed to allocate \
             8.000000 KiB): Not enough room to grow, current/max/try size = 4.000000 KiB, \
             8.000000 KiB, 8.000000 KiB; pool_memory_resource requested 8.0 KiB; in use 3.5 KiB \
             of 4.0 KiB reserved (max 8.0 KiB); free 512 B, largest free block 512 B; \
             verdict: limit"
        );
        // SAFETY: all three came from `p` with these sizes.
        unsafe {
            p.deallocate(s(), a, 1000, 256).unwrap();
            p.deallocate(s(), b, 500, 256).unwrap();
            p.deallocate(s(), c, 2000, 256).unwrap();
        }
    }

    #[test]
    fn absurd_sizes_are_out_of_memory() {
        let (p, mock) = pool(0, Some(1024));
        for bytes in [2048, usize::MAX, usize::MAX - 10, (usize::MAX / 2) + 1] {
            let e = p.allocate(s(), bytes, 256).unwrap_err();
            assert!(e.is_out_of_memory(), "{bytes}: {e}");
        }
        assert!(p
            .allocate(s(), usize::MAX, 256)
            .unwrap_err()
            .to_string()
            .contains("Maximum allocation size exceeded"));
        assert_eq!(mock.allocation_calls(), 0);
        let (unbounded, _) = pool(0, None);
        let e = unbounded.allocate(s(), usize::MAX - 300, 256).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert_eq!(unbounded.pool_size(), 0);
    }

    #[test]
    fn wrong_frees_are_reported_and_change_nothing() {
        let (p, _mock) = pool(4096, None);
        let a = p.allocate(s(), 1000, 256).unwrap();
        let b = p.allocate(s(), 256, 256).unwrap();
        // SAFETY: every call below is a wrong free the pool must detect without touching memory,
        // except the two correct frees of `a`.
        unsafe {
            assert_eq!(
                invalid_free_kind(p.deallocate(s(), a, 2000, 256)),
                InvalidFree::SizeMismatch { allocated: 1024 }
            );
            assert_eq!(
                invalid_free_kind(p.deallocate(s(), DevicePtr::from_raw(a.addr() + 256), 256, 256)),
                InvalidFree::UnknownPointer
            );
            assert_eq!(
                invalid_free_kind(p.deallocate(s(), DevicePtr::from_raw(0xdead_0000), 256, 256)),
                InvalidFree::UnknownPointer
            );
            assert_eq!(
                invalid_free_kind(p.deallocate(s(), a, usize::MAX, 256)),
                InvalidFree::SizeMismatch { allocated: 1024 }
            );
            // The same 256-byte rounding as the allocation is accepted, as in RMM.
            p.deallocate(s(), a, 1024, 256).unwrap();
            assert_eq!(
                invalid_free_kind(p.deallocate(s(), a, 1000, 256)),
                InvalidFree::DoubleFree
            );
        }
        assert_eq!(p.outstanding_allocations(), 1);
        assert_eq!(p.allocate(s(), 1000, 256).unwrap(), a);
        // SAFETY: both came from `p`.
        unsafe {
            p.deallocate(s(), a, 1000, 256).unwrap();
            p.deallocate(s(), b, 256, 256).unwrap();
        }
    }

    #[test]
    fn a_block_freed_on_two_streams_is_a_double_free() {
        // The per-thread default stream's list is special (no event at free time), so no CUDA
        // call is made.
        let pt = CudaStreamView::per_thread();
        let (p, _mock) = pool(4096, None);
        let a = p.allocate(s(), 1000, 256).unwrap();
        // SAFETY: `a` came from `p`; the later frees are wrong frees the pool detects.
        unsafe {
            p.deallocate(pt, a, 1000, 256).unwrap();
            assert_eq!(
                invalid_free_kind(p.deallocate(s(), a, 1000, 256)),
                InvalidFree::DoubleFree
            );
            assert_eq!(
                invalid_free_kind(p.deallocate(pt, a, 1000, 256)),
                InvalidFree::DoubleFree
            );
        }
        assert_eq!(p.outstanding_allocations(), 0);
        // Blocks handed out on the per-thread stream come from its own list first.
        let b = p.allocate(pt, 512, 256).unwrap();
        assert_eq!(b, a);
        // SAFETY: `b` came from `p`, freed on another stream once.
        unsafe {
            assert_eq!(
                invalid_free_kind(p.deallocate(s(), b, 1024, 256)),
                InvalidFree::SizeMismatch { allocated: 512 }
            );
            p.deallocate(s(), b, 512, 256).unwrap();
        }
        assert_eq!(p.outstanding_allocations(), 0);
    }

    /// The figure of `docs/reliability.md` ("lists alive after 10,000 short-lived threads"):
    /// `cargo test -p rmm-mr --all-features --lib lists_alive_after_ten_thousand_threads --
    /// --nocapture` prints it.
    #[test]
    fn lists_alive_after_ten_thousand_threads() {
        use rmm_sys::fault::FaultScope;
        const THREADS: usize = 10_000;
        const AT_ONCE: usize = 8;
        let (p, mock) = pool(1 << 20, None);
        let mut most_alive = 0;
        for batch in 0..THREADS / AT_ONCE {
            let handles: Vec<_> = (0..AT_ONCE)
                .map(|_| {
                    let p = p.clone();
                    std::thread::spawn(move || {
                        // Stealing from the legacy list records an event there (simulated).
                        let _sim = FaultScope::simulated();
                        let pt = CudaStreamView::per_thread();
                        let a = p.allocate(pt, 1000, 256).unwrap();
                        // SAFETY: `a` came from `p` with this size, freed once.
                        unsafe { p.deallocate(pt, a, 1000, 256).unwrap() };
                        stream_lists(&p, false).alive
                    })
                })
                .collect();
            for h in handles {
                // Joined through its handle: the thread's thread-local destructors have run.
                let alive = h.join().unwrap();
                most_alive = most_alive.max(alive);
                // The legacy list and this batch's threads: the threads of earlier batches,
                // all exited, were retired by the first registration of this one.
                assert!(
                    alive <= 1 + AT_ONCE,
                    "batch {batch}: {alive} lists alive for at most {AT_ONCE} live threads"
                );
            }
        }
        let at_end = stream_lists(&p, false);
        let retired = stream_lists(&p, true);
        assert!(at_end.alive <= 1 + AT_ONCE);
        assert_eq!(retired.alive, 1, "only the legacy list should be alive");
        assert!(retired.slots <= AT_ONCE, "{} slots", retired.slots);
        assert_eq!(p.outstanding_allocations(), 0);
        println!(
            "figure: {THREADS} threads ({AT_ONCE} at a time), each allocating and freeing once \
             on its per-thread default stream: at most {most_alive} lists alive at a time, \
             {} alive after the last thread exited ({} once retired), {} list slots made, \
             pool size {} bytes",
            at_end.alive,
            retired.alive,
            retired.slots,
            p.pool_size()
        );
        drop(p);
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn many_pools_on_one_thread_keep_one_list_per_stream() {
        // More pools than the per-thread list cache has slots, used round robin on the
        // per-thread stream (pools that grow on it: no CUDA call).
        let pools: Vec<_> = (0..40).map(|_| pool(0, None).0).collect();
        let pt = CudaStreamView::per_thread();
        for round in 0..5 {
            for (i, p) in pools.iter().enumerate() {
                let a = p.allocate(pt, 256 * (1 + i), 256).unwrap();
                // SAFETY: `a` came from `p` with this size.
                unsafe { p.deallocate(pt, a, 256 * (1 + i), 256).unwrap() };
                assert_eq!(p.inner.core.list_count(), 2, "pool {i}, round {round}");
            }
        }
        // Another thread's per-thread stream gets a list of its own (a free there needs no
        // CUDA call; an allocation would steal from this thread's list, which does).
        let a = pools[0].allocate(pt, 256, 256).unwrap();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                // SAFETY: `a` came from `pools[0]`, freed once.
                unsafe { pools[0].deallocate(pt, a, 256, 256).unwrap() };
            });
        });
        assert_eq!(pools[0].inner.core.list_count(), 3);
        assert!(pools.iter().all(|p| p.outstanding_allocations() == 0));
    }

    #[test]
    fn a_per_thread_block_freed_on_another_thread_goes_to_the_legacy_list() {
        use crate::stream_ordered::stream_lists::{thread_number, StreamKey};
        // The pool grows on this thread's per-thread stream (no CUDA call), so every block
        // starts in this thread's list.
        let (p, _mock) = pool(0, None);
        let pt = CudaStreamView::per_thread();
        let here = StreamKey::PerThread(thread_number());
        let a = p.allocate(pt, 1000, 256).unwrap();
        let b = p.allocate(pt, 1000, 256).unwrap();
        let c = p.allocate(s(), 1000, 256).unwrap();
        let holder = |ptr: DevicePtr| p.inner.core.list_holding(ptr.addr());
        // Freed on the allocating thread: back to its own list.
        // SAFETY: `b` came from `p`, freed once.
        unsafe { p.deallocate(pt, b, 1000, 256).unwrap() };
        assert_eq!(holder(b), Some(here));
        // Freed on another thread's per-thread stream: that thread's stream does not wait for
        // this one's work, so the block goes to the legacy list, not to the freeing thread's.
        // A block allocated on the legacy stream is freed where the caller says.
        let there = std::thread::scope(|sc| {
            sc.spawn(|| {
                // SAFETY: `a` and `c` came from `p`, freed once.
                unsafe {
                    p.deallocate(pt, a, 1000, 256).unwrap();
                    p.deallocate(pt, c, 1000, 256).unwrap();
                }
                StreamKey::PerThread(thread_number())
            })
            .join()
            .unwrap()
        });
        assert_ne!(there, here);
        assert_eq!(holder(a), Some(StreamKey::Legacy));
        assert_eq!(holder(c), Some(there));
        assert_eq!(p.outstanding_allocations(), 0);
        // A second free of `a`, from either thread, is still a double free.
        // SAFETY: wrong frees the pool detects.
        unsafe {
            assert_eq!(
                invalid_free_kind(p.deallocate(pt, a, 1000, 256)),
                InvalidFree::DoubleFree
            );
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    assert_eq!(
                        invalid_free_kind(p.deallocate(pt, a, 1000, 256)),
                        InvalidFree::DoubleFree
                    );
                });
            });
        }
        // The legacy stream reuses the block (its own list, ordered after every blocking
        // stream's earlier work) without any CUDA call. Its list also holds the rest of `c`'s
        // chunk, as large as `a`: which of the two comes first depends on their addresses.
        let x = p.allocate(s(), 1000, 256).unwrap();
        let y = p.allocate(s(), 1000, 256).unwrap();
        assert!(x == a || y == a, "{x} {y} {a}");
        // SAFETY: both came from `p`.
        unsafe {
            p.deallocate(s(), x, 1000, 256).unwrap();
            p.deallocate(s(), y, 1000, 256).unwrap();
        }
    }

    #[test]
    fn release_unused_returns_wholly_free_chunks() {
        let (p, mock) = pool(0, None);
        let a = p.allocate(s(), 1024, 256).unwrap();
        let b = p.allocate(s(), 2048, 256).unwrap();
        let c = p.allocate(s(), 4096, 256).unwrap();
        assert_eq!(
            (p.pool_size(), mock.live_allocations()),
            (1024 + 2048 + 4096, 3)
        );
        assert_eq!(p.release_unused().unwrap(), 0);
        // SAFETY: `a` and `c` came from `p`.
        unsafe {
            p.deallocate(s(), a, 1024, 256).unwrap();
            p.deallocate(s(), c, 4096, 256).unwrap();
        }
        assert_eq!(p.release_unused().unwrap(), 1024 + 4096);
        assert_eq!(p.pool_size(), 2048);
        assert_eq!((mock.live_allocations(), mock.live_bytes()), (1, 2048));
        // A freed pointer of a released chunk is unknown now.
        // SAFETY: a wrong free the pool detects.
        let r = unsafe { p.deallocate(s(), a, 1024, 256) };
        assert_eq!(invalid_free_kind(r), InvalidFree::UnknownPointer);
        // SAFETY: `b` came from `p`.
        unsafe { p.deallocate(s(), b, 2048, 256).unwrap() };
        assert_eq!(p.release_unused().unwrap(), 2048);
        assert_eq!((p.pool_size(), mock.live_allocations()), (0, 0));
        // The pool grows again afterwards.
        let d = p.allocate(s(), 512, 256).unwrap();
        assert_eq!(p.pool_size(), 512);
        // SAFETY: `d` came from `p`.
        unsafe { p.deallocate(s(), d, 512, 256).unwrap() };
    }

    #[test]
    fn a_chunk_the_upstream_refuses_to_take_back_stays_in_the_pool() {
        use crate::testing::{FaultKind, FaultyResource};
        let mock = HostMockResource::new();
        let faulty = FaultyResource::new(mock.clone());
        let p = PoolMemoryResource::new(faulty.clone(), 0).unwrap();
        let a = p.allocate(s(), 1024, 256).unwrap();
        let b = p.allocate(s(), 2048, 256).unwrap();
        // SAFETY: both came from `p`.
        unsafe {
            p.deallocate(s(), a, 1024, 256).unwrap();
            p.deallocate(s(), b, 2048, 256).unwrap();
        }
        let before = p.core_state();
        faulty.fail_next_deallocation(FaultKind::Cuda);
        let e = p.release_unused().unwrap_err();
        assert!(FaultKind::Cuda.matches(&e), "{e}");
        // The refused chunk is still the pool's (and the mock's); the other one is released.
        assert_eq!(p.pool_size(), mock.live_bytes());
        assert_eq!(mock.live_allocations(), 1);
        assert_eq!(p.core_state().chunks.len(), 1);
        assert_ne!(p.core_state(), before);
        let left = p.pool_size();
        assert!(left == 1024 || left == 2048, "{left}");
        assert_eq!(p.release_unused().unwrap(), left);
        assert_eq!((p.pool_size(), mock.live_allocations()), (0, 0));
    }

    #[test]
    fn drop_returns_every_chunk_even_with_allocations_outstanding() {
        let (p, mock) = pool(2048, None);
        let copy = p.clone();
        let _a = p.allocate(s(), 2048, 256).unwrap();
        let _b = p.allocate(s(), 5000, 256).unwrap();
        let c = p.allocate(s(), 100, 256).unwrap();
        // SAFETY: `c` came from `p`.
        unsafe { p.deallocate(s(), c, 100, 256).unwrap() };
        let chunks = mock.live_allocations();
        assert!(chunks >= 2);
        drop(p);
        assert_eq!(
            mock.live_allocations(),
            chunks,
            "a copy still holds the pool"
        );
        assert_eq!(copy.outstanding_allocations(), 2);
        drop(copy);
        assert_eq!(mock.live_allocations(), 0);
        assert_eq!(mock.deallocation_calls(), chunks);
    }

    #[test]
    fn copies_share_state_and_compare_equal() {
        let (p, mock) = pool(1024, None);
        let q = p.clone();
        assert!(p.is_equal(&q));
        assert!(!p.is_equal(&pool(1024, None).0));
        assert!(!p.is_equal(&mock));
        assert!(p.upstream().is_equal(&mock));
        let a = q.allocate(s(), 256, 256).unwrap();
        assert_eq!(p.outstanding_allocations(), 1);
        // SAFETY: `a` came from a copy of `p`, which is equal to it.
        unsafe { p.deallocate(s(), a, 256, 256).unwrap() };
        let erased = shared(p.clone());
        let back = resource_cast::<PoolMemoryResource<HostMockResource>>(&*erased).unwrap();
        assert!(back.is_equal(&p));
        assert!(resource_cast::<HostMockResource>(&*erased).is_none());
        assert_eq!(p.properties(), mock.properties());
        assert!(format!("{p:?}").contains("PoolMemoryResource"));
    }

    /// Threads that miss together must grow the pool only as much as they need: each waiting
    /// grower looks at the free lists again once it holds the growth lock. (Without that, 4
    /// threads replaying a 2 GiB-peak trace on an H200 grew a pool to over 100 GiB.)
    #[test]
    fn concurrent_misses_grow_the_pool_only_as_needed() {
        const THREADS: usize = 4;
        const X: usize = 1 << 20;
        let mock = HostMockResource::new();
        let pool = PoolMemoryResource::new(mock.clone(), 0).unwrap();
        let barrier = std::sync::Barrier::new(THREADS);
        let ptrs: Vec<DevicePtr> = std::thread::scope(|sc| {
            let joins: Vec<_> = (0..THREADS)
                .map(|_| {
                    sc.spawn(|| {
                        barrier.wait();
                        pool.allocate(s(), X, 256).unwrap()
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        // Growth sizes are max(request, pool size): X, X, 2X (whose second half serves the
        // fourth thread), so exactly 4X; a grower that did not look again would add 4X more.
        assert_eq!(
            pool.pool_size(),
            THREADS * X,
            "the pool grew more than its users needed"
        );
        for p in ptrs {
            // SAFETY: each came from `pool` with X bytes.
            unsafe { pool.deallocate(s(), p, X, 256).unwrap() };
        }
        drop(pool);
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn many_threads_on_the_default_stream_never_share_memory() {
        let (p, mock) = pool(0, None);
        std::thread::scope(|sc| {
            for t in 0..4u8 {
                let p = p.clone();
                sc.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(t);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut live: Vec<(DevicePtr, usize, u8)> = Vec::new();
                    for i in 0..1500u32 {
                        if live.len() < 16 && (live.is_empty() || next() % 3 != 0) {
                            let bytes = 1 + (next() % 8192) as usize;
                            let ptr = p.allocate(s(), bytes, 256).unwrap();
                            let tag = t.wrapping_mul(61).wrapping_add(i as u8) | 1;
                            // SAFETY: the mock gives host memory; `ptr` is ours for `bytes`.
                            unsafe { fill(ptr, bytes, tag) };
                            live.push((ptr, bytes, tag));
                        } else {
                            let (ptr, bytes, tag) =
                                live.swap_remove((next() as usize) % live.len());
                            // SAFETY: as above; then the block is freed once.
                            unsafe {
                                assert!(
                                    holds(ptr, bytes, tag),
                                    "another allocation wrote into {ptr}"
                                );
                                p.deallocate(s(), ptr, bytes, 256).unwrap();
                            }
                        }
                    }
                    for (ptr, bytes, tag) in live {
                        // SAFETY: as above.
                        unsafe {
                            assert!(
                                holds(ptr, bytes, tag),
                                "another allocation wrote into {ptr}"
                            );
                            p.deallocate(s(), ptr, bytes, 256).unwrap();
                        }
                    }
                });
            }
        });
        assert_eq!(p.outstanding_allocations(), 0);
        let size = p.pool_size();
        assert_eq!(p.release_unused().unwrap(), size);
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn a_second_stream_key_turns_the_pool_eager() {
        let (p, _mock) = pool(4096, None);
        let a = p.allocate(s(), 256, 256).unwrap();
        assert!(!p.inner.core.is_eager(), "one stream key, yet eager");
        // SAFETY: `a` came from `p`.
        unsafe { p.deallocate(s(), a, 256, 256).unwrap() };
        // The per-thread default stream of this thread is a second key (no CUDA call: its list
        // is special; its first allocation steals, which does need CUDA).
        let r = p.allocate(CudaStreamView::per_thread(), 256, 256);
        assert!(p.inner.core.is_eager());
        assert_eq!(p.inner.core.list_count(), 2);
        match r {
            Ok(b) => {
                // SAFETY: `b` came from `p` on this stream.
                unsafe {
                    p.deallocate(CudaStreamView::per_thread(), b, 256, 256)
                        .unwrap()
                };
            }
            Err(e) => {
                // Stealing from the legacy list records an event: without a GPU that fails, and
                // the block stays where it was.
                assert!(rmm_sys::gpu_unavailable_reason().is_some(), "{e}");
                assert_eq!(p.allocate(s(), 4096, 256).unwrap().addr(), a.addr());
            }
        }
    }

    const MIB: usize = 1 << 20;

    /// A pool of at most `max` bytes over simulated memory of `max` bytes (which takes freed
    /// chunks back), and that memory.
    fn simulated_pool(
        max: usize,
    ) -> (
        PoolMemoryResource<crate::SimulatedMemoryResource>,
        crate::SimulatedMemoryResource,
    ) {
        let device = crate::SimulatedMemoryResource::new(max).unwrap();
        let options = PoolOptions::new(0).maximum_pool_size(max);
        let pool = PoolMemoryResource::with_options(device.clone(), options).unwrap();
        (pool, device)
    }

    /// Three ordinary streams of the simulated driver (the caller holds a `FaultScope`).
    fn three_streams() -> [CudaStreamView<'static>; 3] {
        [1, 2, 3].map(CudaStreamView::simulated)
    }

    /// Growth under pressure: stream B misses while stream A's list holds a fitting block no
    /// event covers yet (A's list is lazy). B asks A to record and grows by its request only,
    /// not by `size_to_grow`'s doubling; once A recorded, B steals instead of growing; and a
    /// miss that no list could serve still grows by RMM's rule.
    #[test]
    fn a_withheld_block_makes_the_pool_grow_by_the_request_only() {
        let _sim = rmm_sys::fault::FaultScope::simulated();
        let device = crate::SimulatedMemoryResource::new(1 << 40).unwrap();
        let p = PoolMemoryResource::new(device.clone(), 0).unwrap();
        let [a, b, _] = three_streams();
        // A grows the pool 1 + 1 + 2 MiB (RMM's rule) and frees everything, unrecorded.
        let blocks: Vec<DevicePtr> = (0..4).map(|_| p.allocate(a, MIB, 256).unwrap()).collect();
        assert_eq!(p.pool_size(), 4 * MIB);
        for &x in &blocks {
            // SAFETY: from `p` with this size, freed once.
            unsafe { p.deallocate(a, x, MIB, 256).unwrap() };
        }
        // B's first allocation finds A's blocks uncovered: 1 MiB more, not 4.
        let b1 = p.allocate(b, MIB, 256).unwrap();
        assert_eq!(
            p.pool_size(),
            5 * MIB,
            "the pool grew by its size, not the request"
        );
        assert_eq!(device.used(), 5 * MIB);
        // A's next operation records; B's next allocation steals one of A's blocks.
        let a1 = p.allocate(a, MIB, 256).unwrap();
        // SAFETY: from `p` with this size, freed once.
        unsafe { p.deallocate(a, a1, MIB, 256).unwrap() };
        let b2 = p.allocate(b, MIB, 256).unwrap();
        assert!(blocks.contains(&b2), "B did not steal A's block");
        assert_eq!(p.pool_size(), 5 * MIB);
        // 3 MiB fit in no list (chunks never merge): an ordinary growth, max(3 MiB, 5 MiB).
        let b3 = p.allocate(b, 3 * MIB, 256).unwrap();
        assert_eq!(p.pool_size(), 10 * MIB);
        // SAFETY: from `p` with these sizes, freed once.
        unsafe {
            p.deallocate(b, b1, MIB, 256).unwrap();
            p.deallocate(b, b2, MIB, 256).unwrap();
            p.deallocate(b, b3, 3 * MIB, 256).unwrap();
        }
        assert_eq!(p.outstanding_allocations(), 0);
    }

    /// The grower's wait is bounded for the whole growth, not per search
    /// (`stream_ordered::patience`, the budget): while it waits, frees keep coming (so it never
    /// stops for want of any), and every 500th says it left a fitting block that the grower's
    /// next search does not find (another thread took it first). With a wait per search, every
    /// search would wait again, without end under the growth lock; with one budget per hold of
    /// the lock, at most `PATIENCE` yields and searches (or `WAIT_TIME`), and the pool grows.
    #[test]
    fn a_growers_wait_is_bounded_for_the_whole_growth() {
        use crate::stream_ordered::tuning::PATIENCE;
        use std::sync::atomic::{AtomicU32, Ordering};
        let (p, mock) = pool(4096, None);
        let a = p.allocate(s(), 4096, 256).unwrap();
        let yields = Arc::new(AtomicU32::new(0));
        let (pc, y) = (p.clone(), Arc::clone(&yields));
        *p.inner.core.patience().yielding.lock().unwrap() = Some(Box::new(move || {
            let n = y.fetch_add(1, Ordering::Relaxed) + 1;
            pc.inner.core.patience().freed(|_| n % 500 == 0);
        }));
        let b = p.allocate(s(), 4096, 256).unwrap();
        // The hook holds a handle of the pool.
        drop(p.inner.core.patience().yielding.lock().unwrap().take());
        let yields = yields.load(Ordering::Relaxed);
        assert!(yields <= PATIENCE, "{yields} yields under the growth lock");
        let holds = p.growth_lock_holds();
        assert_eq!(holds.count(), 1, "one hold of the growth lock");
        assert_eq!(holds.max_yields(), u64::from(yields));
        assert_eq!(holds.budget_ran_out(), 1, "the budget ended the wait");
        assert_eq!((mock.allocation_calls(), p.pool_size()), (2, 8192));
        // SAFETY: from `p` with these sizes, freed once.
        unsafe {
            p.deallocate(s(), a, 4096, 256).unwrap();
            p.deallocate(s(), b, 4096, 256).unwrap();
        }
    }

    /// RMM issue 2039's shape: blocks allocated on one stream and freed on another lie, once
    /// free, in the lists of the streams that freed them, over chunks that never merge (32,
    /// 16, 8, ... MiB for a maximum of 64 MiB). Before failing, the pool merges the lists,
    /// gives the wholly free chunks back (after a device synchronization) and grows one chunk
    /// of what is asked; a chunk with a block in use stays.
    #[test]
    fn before_failing_the_pool_gives_free_chunks_back_and_grows_one() {
        let _sim = rmm_sys::fault::FaultScope::simulated();
        let max = 64 * MIB;
        let (p, device) = simulated_pool(max);
        let st = three_streams();
        let blocks: Vec<(DevicePtr, usize)> = (0..48)
            .map(|i| (p.allocate(st[i % 3], MIB, 256).unwrap(), i))
            .collect();
        let chunks = p.core_state().chunks.len();
        assert!(chunks >= 3, "{chunks} chunks");
        // One block stays in use; the others are freed on the next stream.
        let (held, held_on) = blocks[47];
        for &(b, i) in &blocks[..47] {
            // SAFETY: from `p` with this size, freed once.
            unsafe { p.deallocate(st[(i + 1) % 3], b, MIB, 256).unwrap() };
        }
        assert!(
            p.core_state().lists.len() >= 3,
            "the free blocks lie in several lists"
        );
        let syncs = rmm_sys::fault::calls(rmm_sys::fault::DriverCall::Synchronize);
        // The held block's chunk cannot go, so the maximum cannot be had ...
        let e = p.allocate(st[0], max, 256).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(
            rmm_sys::fault::calls(rmm_sys::fault::DriverCall::Synchronize) > syncs,
            "chunks were released without a device synchronization"
        );
        // ... but the wholly free chunks went back: only the held block's remains.
        assert_eq!(p.core_state().chunks.len(), 1);
        assert_eq!(p.pool_size(), device.used());
        // What is free now is served in one block.
        let room = max - p.pool_size();
        let big = p.allocate(st[1], room, 256).unwrap();
        // SAFETY: both from `p` with these sizes, freed once.
        unsafe {
            p.deallocate(st[1], big, room, 256).unwrap();
            p.deallocate(st[held_on % 3], held, MIB, 256).unwrap();
        }
        // Everything free: the maximum in one block, from one chunk.
        let all = p.allocate(st[2], max, 256).unwrap();
        assert_eq!((p.pool_size(), p.core_state().chunks.len()), (max, 1));
        // SAFETY: from `p` with this size.
        unsafe { p.deallocate(st[2], all, max, 256).unwrap() };
        assert_eq!(p.outstanding_allocations(), 0);
    }

    /// No chunk is given back unless the device synchronization before it succeeded: the
    /// allocation fails and the pool keeps every chunk.
    #[test]
    fn a_failed_synchronization_gives_no_chunk_back() {
        use rmm_sys::fault::{self, DriverCall};
        let _sim = fault::FaultScope::simulated();
        let max = 16 * MIB;
        let (p, device) = simulated_pool(max);
        let s = CudaStreamView::legacy();
        let blocks: Vec<DevicePtr> = (0..12).map(|_| p.allocate(s, MIB, 256).unwrap()).collect();
        for b in blocks {
            // SAFETY: from `p` with this size, freed once.
            unsafe { p.deallocate(s, b, MIB, 256).unwrap() };
        }
        let before = p.core_state();
        assert!(before.chunks.len() > 1);
        fault::fail_next(DriverCall::Synchronize, 100);
        let e = p.allocate(s, max, 256).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(fault::injected(DriverCall::Synchronize) > 0);
        assert_eq!(p.core_state(), before);
        assert_eq!(device.used(), p.pool_size());
        fault::disarm(DriverCall::Synchronize);
        let all = p.allocate(s, max, 256).unwrap();
        // SAFETY: from `p` with this size.
        unsafe { p.deallocate(s, all, max, 256).unwrap() };
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1usize..20_000).prop_map(Op::Alloc),
            2 => any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        /// Against a model of the live set: blocks are 256-aligned, never overlap, and the pool
        /// gives everything back.
        #[test]
        fn model(initial in 0usize..64, maximum in proptest::option::of(64usize..512), ops in proptest::collection::vec(op(), 1..120)) {
            let initial = initial * 256;
            let maximum = maximum.map(|m| (m * 256).max(initial));
            let (p, mock) = pool(initial, maximum);
            let mut live: Vec<(u64, usize)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(bytes) => match p.allocate(s(), bytes, 256) {
                        Ok(ptr) => {
                            let (addr, size) = (ptr.addr(), rmm_sys::align_up(bytes, 256));
                            prop_assert!(ptr.is_aligned(256));
                            for &(a, n) in &live {
                                let (an, bn) = (a + rmm_sys::align_up(n, 256) as u64, addr + size as u64);
                                prop_assert!(bn <= a || an <= addr, "overlap");
                            }
                            live.push((addr, bytes));
                        }
                        Err(e) => {
                            prop_assert!(e.is_out_of_memory());
                            prop_assert!(maximum.is_some());
                        }
                    },
                    Op::Free(i) if !live.is_empty() => {
                        let (addr, bytes) = live.swap_remove(i % live.len());
                        // SAFETY: from `p` with `bytes`, freed once.
                        unsafe { p.deallocate(s(), DevicePtr::from_raw(addr), bytes, 256).unwrap() };
                    }
                    Op::Free(_) => {}
                }
                prop_assert_eq!(p.outstanding_allocations(), live.len());
                // RMM rounds the remaining headroom up to 256, and halving can leave chunk sizes
                // that are not multiples of 256: the maximum can be overshot by less than 256.
                prop_assert!(maximum.is_none_or(|m| p.pool_size() < m + 256));
                prop_assert_eq!(p.pool_size(), mock.live_bytes());
            }
            for (addr, bytes) in live.drain(..) {
                // SAFETY: as above.
                unsafe { p.deallocate(s(), DevicePtr::from_raw(addr), bytes, 256).unwrap() };
            }
            let size = p.pool_size();
            prop_assert_eq!(p.release_unused().unwrap(), size);
            prop_assert_eq!(mock.live_allocations(), 0);
        }

        /// Blocks allocated on one stream and freed on another, under a maximum: whatever the
        /// order, once everything is free the maximum is served in one block (the lists merge
        /// and the wholly free chunks go back before the pool fails), and the pool never holds
        /// more than the maximum or loses track of a byte.
        #[test]
        fn multi_stream_frees_leave_the_maximum_servable(ops in proptest::collection::vec((1usize..24, any::<usize>(), any::<bool>()), 1..80)) {
            let _sim = rmm_sys::fault::FaultScope::simulated();
            let max = 256 * 256 * 64;
            let (p, device) = simulated_pool(max);
            let st = three_streams();
            let mut live: Vec<(DevicePtr, usize, usize)> = Vec::new();
            for (i, (units, pick, alloc)) in ops.into_iter().enumerate() {
                if alloc || live.is_empty() {
                    let bytes = units * 256 * 64 - 100;
                    match p.allocate(st[i % 3], bytes, 256) {
                        Ok(ptr) => live.push((ptr, bytes, i % 3)),
                        Err(e) => prop_assert!(e.is_out_of_memory(), "{}", e),
                    }
                } else {
                    let (ptr, bytes, s) = live.swap_remove(pick % live.len());
                    // SAFETY: from `p` with `bytes`, freed once, on another stream.
                    unsafe { p.deallocate(st[(s + 1 + pick % 2) % 3], ptr, bytes, 256).unwrap() };
                }
                prop_assert!(p.pool_size() <= max);
                prop_assert_eq!(p.pool_size(), device.used());
            }
            for (ptr, bytes, s) in live.drain(..) {
                // SAFETY: as above.
                unsafe { p.deallocate(st[(s + 1) % 3], ptr, bytes, 256).unwrap() };
            }
            let all = p.allocate(st[0], max, 256);
            prop_assert!(all.is_ok(), "{:?}", all);
            // SAFETY: from `p` with this size.
            unsafe { p.deallocate(st[0], all.unwrap(), max, 256).unwrap() };
            prop_assert_eq!(p.outstanding_allocations(), 0);
        }
    }
}
