//! The pool's growth policy (RMM's `pool_memory_resource_impl`: `size_to_grow`,
//! `try_to_expand`, the constructor checks and the out-of-memory messages).
//!
//! - [`PoolSizes`] validates the constructor's initial and maximum sizes.
//! - [`size_to_grow`] picks the size of the next upstream chunk: without a maximum the pool at
//!   least doubles; with one, it takes half the remaining headroom (or the request if larger),
//!   and 0 means there is no room at all.
//! - [`GrowthPlan`] yields the sizes RMM's halving retry asks the upstream for, and
//!   [`try_to_expand`] runs that retry against any upstream closure, building RMM's
//!   out-of-memory error ([`PoolOutOfMemory`]) on failure.
//!
//! Pure bookkeeping: no CUDA calls. The caller rounds requests up to 256 bytes before asking
//! for growth, as RMM does.

use std::fmt;

use rmm_sys::align::{align_up, is_aligned, ALLOCATION_ALIGNMENT};

use crate::util::format::format_bytes;

/// Why the pool's constructor arguments were rejected (RMM throws `rmm::logic_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrowthError {
    /// `initial` is not a multiple of 256.
    InitialNotAligned {
        /// The rejected initial size.
        initial: usize,
    },
    /// `maximum` is not a multiple of 256.
    MaximumNotAligned {
        /// The rejected maximum size.
        maximum: usize,
    },
    /// `initial > maximum`.
    InitialExceedsMaximum {
        /// The initial size.
        initial: usize,
        /// The maximum size.
        maximum: usize,
    },
}

impl fmt::Display for GrowthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InitialNotAligned { .. } => {
                "Error, Initial pool size required to be a multiple of 256 bytes"
            }
            Self::MaximumNotAligned { .. } => {
                "Error, Maximum pool size required to be a multiple of 256 bytes"
            }
            Self::InitialExceedsMaximum { .. } => {
                "Initial pool size exceeds the maximum pool size!"
            }
        })
    }
}

impl std::error::Error for GrowthError {}

/// The validated `(initial_pool_size, maximum_pool_size)` pair of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSizes {
    initial: usize,
    maximum: Option<usize>,
}

impl PoolSizes {
    /// Validates the sizes the way RMM's constructor does, in the same order: `initial` a
    /// multiple of 256, `maximum` (if any) a multiple of 256, then `initial <= maximum`.
    /// `initial == 0` is allowed (the pool grows lazily); `maximum == None` means unbounded.
    ///
    /// # Errors
    ///
    /// The [`GrowthError`] for the first check that fails.
    pub fn new(initial: usize, maximum: Option<usize>) -> Result<Self, GrowthError> {
        if !is_aligned(initial, ALLOCATION_ALIGNMENT) {
            return Err(GrowthError::InitialNotAligned { initial });
        }
        if let Some(maximum) = maximum {
            if !is_aligned(maximum, ALLOCATION_ALIGNMENT) {
                return Err(GrowthError::MaximumNotAligned { maximum });
            }
            if initial > maximum {
                return Err(GrowthError::InitialExceedsMaximum { initial, maximum });
            }
        }
        Ok(Self { initial, maximum })
    }

    /// The size of the chunk obtained at construction (0: none).
    #[must_use]
    pub const fn initial(&self) -> usize {
        self.initial
    }

    /// The cap on the sum of upstream chunks, if any.
    #[must_use]
    pub const fn maximum(&self) -> Option<usize> {
        self.maximum
    }

    /// [`size_to_grow`] with this pool's maximum.
    #[must_use]
    pub fn size_to_grow(&self, pool_size: usize, request: usize) -> usize {
        size_to_grow(pool_size, request, self.maximum)
    }

    /// [`size_under_pressure`] with this pool's maximum.
    #[must_use]
    pub fn size_under_pressure(&self, pool_size: usize, request: usize) -> usize {
        size_under_pressure(pool_size, request, self.maximum)
    }
}

/// The size of the next upstream chunk for a pool of `pool_size` bytes that cannot serve
/// `request` bytes from its free lists; 0 when the maximum leaves no room for the request.
///
/// - With a maximum: `remaining = align_up(maximum - pool_size, 256)`; if
///   `align_up(request, 256) <= remaining` the result is the larger of that and
///   `remaining / 2`, else 0.
/// - Without: `max(request, pool_size)`, so the pool at least doubles.
#[doc(alias = "rmm::mr::pool_memory_resource::size_to_grow")]
#[must_use]
pub fn size_to_grow(pool_size: usize, request: usize, maximum: Option<usize>) -> usize {
    match maximum {
        Some(maximum) => {
            let remaining = align_up(maximum.saturating_sub(pool_size), ALLOCATION_ALIGNMENT);
            match rmm_sys::align::checked_align_up(request, ALLOCATION_ALIGNMENT) {
                Some(aligned) if aligned <= remaining => aligned.max(remaining / 2),
                _ => 0,
            }
        }
        None => request.max(pool_size),
    }
}

/// The size of the next upstream chunk when the pool grows *under pressure*: another stream's
/// list holds a block that would serve `request`, but no event covers it yet (the stream-ordered
/// core's lazy event rule asked its owner to record, and the block is stealable after the
/// owner's next operation). The memory exists, so the pool takes only what the request needs:
/// `align_up(request, 256)`, or 0 when that does not fit under the maximum (as
/// [`size_to_grow`]). For a request that is a multiple of 256 (as the pool asks), never more
/// than [`size_to_grow`], 0 exactly when it is 0, and equal to it for an empty pool without a
/// maximum.
///
/// ```
/// use rmm_mr::__internals::pool::{size_to_grow, size_under_pressure};
/// // 1 GiB pool, 1000-byte request: RMM's rule doubles the pool, pressure takes 1 KiB.
/// assert_eq!(size_to_grow(1 << 30, 1000, None), 1 << 30);
/// assert_eq!(size_under_pressure(1 << 30, 1000, None), 1024);
/// ```
#[must_use]
pub fn size_under_pressure(pool_size: usize, request: usize, maximum: Option<usize>) -> usize {
    // The request, rounded, wherever RMM's rule would grow at all (its maximum check).
    match rmm_sys::align::checked_align_up(request, ALLOCATION_ALIGNMENT) {
        Some(aligned) if size_to_grow(pool_size, request, maximum) != 0 => aligned,
        _ => 0,
    }
}

/// The sizes RMM's `try_to_expand` asks the upstream for, in order: `try_size`, then
/// `max(min_size, previous / 2)`, ..., ending with `min_size`. Empty when
/// `try_size < min_size` (in particular when [`size_to_grow`] returned 0).
///
/// ```
/// use rmm_mr::__internals::pool::GrowthPlan;
/// let sizes: Vec<usize> = GrowthPlan::new(5120, 512).collect();
/// assert_eq!(sizes, [5120, 2560, 1280, 640, 512]);
/// ```
///
/// A caller stops at the first size the upstream grants:
/// `for size in plan { if let Ok(chunk) = upstream(size) { ... break } }`.
/// Sizes after the first may not be multiples of 256 (RMM allows that too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowthPlan {
    next: Option<usize>,
    min_size: usize,
}

impl GrowthPlan {
    /// The plan for a first try of `try_size` bytes that must not go below `min_size`.
    #[must_use]
    pub const fn new(try_size: usize, min_size: usize) -> Self {
        Self {
            next: if try_size >= min_size {
                Some(try_size)
            } else {
                None
            },
            min_size,
        }
    }

    /// The smallest size the plan will try.
    #[must_use]
    pub const fn min_size(&self) -> usize {
        self.min_size
    }
}

impl Iterator for GrowthPlan {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        self.next = if current <= self.min_size {
            None
        } else {
            Some(self.min_size.max(current / 2))
        };
        Some(current)
    }
}

impl std::iter::FusedIterator for GrowthPlan {}

/// Why the pool could not grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrowthFailure {
    /// The upstream refused every size of the plan; its last (at `min_size`) message.
    Upstream(String),
    /// The maximum pool size leaves no room for the request.
    NotEnoughRoom {
        /// Bytes obtained from upstream so far.
        current: usize,
        /// The pool's maximum (`None`: unbounded, printed as `SIZE_MAX` like RMM).
        maximum: Option<usize>,
        /// The request (the plan's minimum size).
        try_size: usize,
    },
}

impl fmt::Display for GrowthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Upstream(reason) => f.write_str(reason),
            Self::NotEnoughRoom {
                current,
                maximum,
                try_size,
            } => write!(
                f,
                "Not enough room to grow, current/max/try size = {}, {}, {}",
                format_bytes(*current),
                format_bytes(maximum.unwrap_or(usize::MAX)),
                format_bytes(*try_size)
            ),
        }
    }
}

/// The pool could not obtain `min_size` more bytes: RMM's `rmm::out_of_memory` with the text
/// `"Maximum pool size exceeded (failed to allocate <min_size>): <reason>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOutOfMemory {
    /// The size the pool needed (the request, rounded to 256).
    pub min_size: usize,
    /// Why growing failed.
    pub reason: GrowthFailure,
}

impl fmt::Display for PoolOutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Maximum pool size exceeded (failed to allocate {}): {}",
            format_bytes(self.min_size),
            self.reason
        )
    }
}

impl std::error::Error for PoolOutOfMemory {}

/// A chunk obtained by [`try_to_expand`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grown<T> {
    /// What the upstream returned (an address, a handle, ...).
    pub chunk: T,
    /// The size that was granted.
    pub size: usize,
}

/// RMM's `try_to_expand`: asks `upstream` for the sizes of `GrowthPlan::new(try_size,
/// min_size)` in turn and returns the first chunk granted. `pool_size` and `maximum` only feed
/// the error message. The caller adds `size` to its pool size and records the chunk.
///
/// # Errors
///
/// [`PoolOutOfMemory`] with [`GrowthFailure::Upstream`] (the upstream's message at `min_size`)
/// when every try failed, or [`GrowthFailure::NotEnoughRoom`] when the plan is empty
/// (`try_size < min_size`, e.g. [`size_to_grow`] returned 0).
#[doc(alias = "rmm::mr::pool_memory_resource::try_to_expand")]
pub fn try_to_expand<T, E: fmt::Display>(
    try_size: usize,
    min_size: usize,
    pool_size: usize,
    maximum: Option<usize>,
    mut upstream: impl FnMut(usize) -> Result<T, E>,
) -> Result<Grown<T>, PoolOutOfMemory> {
    let mut last_error = None;
    for size in GrowthPlan::new(try_size, min_size) {
        match upstream(size) {
            Ok(chunk) => return Ok(Grown { chunk, size }),
            Err(e) => last_error = Some(e.to_string()),
        }
    }
    let reason = match last_error {
        Some(message) => GrowthFailure::Upstream(message),
        None => GrowthFailure::NotEnoughRoom {
            current: pool_size,
            maximum,
            try_size: min_size,
        },
    };
    Err(PoolOutOfMemory { min_size, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::coalescing_model::{Block, CoalescingFreeList};
    use proptest::prelude::*;

    #[test]
    fn pool_sizes_validation_and_messages() {
        assert_eq!(
            PoolSizes::new(0, None),
            Ok(PoolSizes {
                initial: 0,
                maximum: None
            })
        );
        let ok = PoolSizes::new(1024, Some(1024)).unwrap();
        assert_eq!((ok.initial(), ok.maximum()), (1024, Some(1024)));
        let e = PoolSizes::new(1000, None).unwrap_err();
        assert_eq!(e, GrowthError::InitialNotAligned { initial: 1000 });
        assert_eq!(
            e.to_string(),
            "Error, Initial pool size required to be a multiple of 256 bytes"
        );
        let e = PoolSizes::new(1024, Some(2000)).unwrap_err();
        assert_eq!(e, GrowthError::MaximumNotAligned { maximum: 2000 });
        assert_eq!(
            e.to_string(),
            "Error, Maximum pool size required to be a multiple of 256 bytes"
        );
        let e = PoolSizes::new(2048, Some(1024)).unwrap_err();
        assert_eq!(
            e,
            GrowthError::InitialExceedsMaximum {
                initial: 2048,
                maximum: 1024
            }
        );
        assert_eq!(
            e.to_string(),
            "Initial pool size exceeds the maximum pool size!"
        );
        // RMM checks alignment before the order of the two sizes.
        assert_eq!(
            PoolSizes::new(2000, Some(1024)),
            Err(GrowthError::InitialNotAligned { initial: 2000 })
        );
    }

    #[test]
    fn size_to_grow_cases() {
        // Unbounded: at least double.
        assert_eq!(size_to_grow(0, 1024, None), 1024);
        assert_eq!(size_to_grow(5120, 512, None), 5120);
        assert_eq!(size_to_grow(1024, 4096, None), 4096);
        // Bounded: half the headroom, or the request if larger, or 0.
        assert_eq!(size_to_grow(0, 1024, Some(8192)), 4096);
        assert_eq!(size_to_grow(4096, 4096, Some(8192)), 4096);
        assert_eq!(size_to_grow(4096, 1000, Some(8192)), 2048);
        assert_eq!(size_to_grow(4096, 4097, Some(8192)), 0);
        assert_eq!(size_to_grow(1024, 256, Some(1024)), 0);
        // Remaining headroom is rounded up (halving can leave unaligned pool sizes).
        assert_eq!(size_to_grow(8000, 256, Some(8192)), 256);
        assert_eq!(size_to_grow(0, usize::MAX, Some(8192)), 0);
        let sizes = PoolSizes::new(0, Some(8192)).unwrap();
        assert_eq!(sizes.size_to_grow(0, 1024), 4096);
    }

    #[test]
    fn size_under_pressure_cases() {
        // Unbounded: the request, rounded to 256, whatever the pool holds.
        assert_eq!(size_under_pressure(0, 1000, None), 1024);
        assert_eq!(size_under_pressure(1 << 30, 1000, None), 1024);
        assert_eq!(size_under_pressure(5120, 512, None), 512);
        // Bounded: the request if it fits under the maximum, else 0 (as size_to_grow).
        assert_eq!(size_under_pressure(0, 1024, Some(8192)), 1024);
        assert_eq!(size_under_pressure(4096, 4096, Some(8192)), 4096);
        assert_eq!(size_under_pressure(4096, 4097, Some(8192)), 0);
        assert_eq!(size_under_pressure(1024, 256, Some(1024)), 0);
        assert_eq!(size_under_pressure(8000, 256, Some(8192)), 256);
        assert_eq!(size_under_pressure(0, usize::MAX, None), 0);
        assert_eq!(size_under_pressure(0, usize::MAX, Some(8192)), 0);
        let sizes = PoolSizes::new(0, Some(8192)).unwrap();
        assert_eq!(sizes.size_under_pressure(4096, 1000), 1024);
    }

    #[test]
    fn plan_halves_down_to_min() {
        assert_eq!(
            GrowthPlan::new(5760, 2048).collect::<Vec<_>>(),
            [5760, 2880, 2048]
        );
        assert_eq!(GrowthPlan::new(4096, 4096).collect::<Vec<_>>(), [4096]);
        assert_eq!(GrowthPlan::new(0, 256).count(), 0);
        assert_eq!(
            GrowthPlan::new(1000, 1).collect::<Vec<_>>().last(),
            Some(&1)
        );
        assert_eq!(GrowthPlan::new(0, 0).collect::<Vec<_>>(), [0]);
        assert_eq!(GrowthPlan::new(10, 3).min_size(), 3);
    }

    #[test]
    fn try_to_expand_messages() {
        let err =
            try_to_expand(5760, 2048, 5760, None, |_| Err::<(), _>("out of memory")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Maximum pool size exceeded (failed to allocate 2.000000 KiB): out of memory"
        );
        let err = try_to_expand(0, 256, 1024, Some(1024), |_| Ok::<_, String>(())).unwrap_err();
        assert_eq!(
            err.reason,
            GrowthFailure::NotEnoughRoom {
                current: 1024,
                maximum: Some(1024),
                try_size: 256
            }
        );
        assert_eq!(
            err.to_string(),
            "Maximum pool size exceeded (failed to allocate 256.000000 B): Not enough room to \
             grow, current/max/try size = 1024.000000 B, 1024.000000 B, 256.000000 B"
        );
        let mut tried = Vec::new();
        let grown = try_to_expand(4096, 1024, 0, None, |s| {
            tried.push(s);
            if s <= 2048 {
                Ok(0xdead_0000u64)
            } else {
                Err("no")
            }
        })
        .unwrap();
        assert_eq!(tried, [4096, 2048]);
        assert_eq!(
            grown,
            Grown {
                chunk: 0xdead_0000,
                size: 2048
            }
        );
    }

    /// A model pool (one free list, growth policy) over an upstream that refuses to hand out
    /// more than `limit` bytes in total, like RMM's `limiting_resource_adaptor`.
    struct ModelPool {
        sizes: PoolSizes,
        free: CoalescingFreeList,
        pool_size: usize,
        used_upstream: usize,
        limit: usize,
        next_addr: u64,
        /// Every size asked of the upstream, and whether it was granted.
        upstream_log: Vec<(usize, bool)>,
        chunks: Vec<(u64, usize)>,
    }

    impl ModelPool {
        fn new(limit: usize, maximum: Option<usize>) -> Self {
            Self {
                sizes: PoolSizes::new(0, maximum).unwrap(),
                free: CoalescingFreeList::new(),
                pool_size: 0,
                used_upstream: 0,
                limit,
                next_addr: 1 << 30,
                upstream_log: Vec::new(),
                chunks: Vec::new(),
            }
        }

        fn allocate(&mut self, bytes: usize) -> Result<Block, PoolOutOfMemory> {
            let size = align_up(bytes, ALLOCATION_ALIGNMENT);
            if let Some(b) = self.free.allocate(size) {
                return Ok(b);
            }
            let grow = self.sizes.size_to_grow(self.pool_size, size);
            let (used, limit, next_addr, log) = (
                &mut self.used_upstream,
                self.limit,
                &mut self.next_addr,
                &mut self.upstream_log,
            );
            let grown = try_to_expand(grow, size, self.pool_size, self.sizes.maximum(), |s| {
                let ok = *used + s <= limit;
                log.push((s, ok));
                if ok {
                    *used += s;
                    let addr = *next_addr;
                    *next_addr += s as u64 + 4096;
                    Ok(addr)
                } else {
                    Err("std::bad_alloc: out_of_memory")
                }
            })?;
            self.pool_size += grown.size;
            self.chunks.push((grown.chunk, grown.size));
            self.free
                .insert(Block::new(grown.chunk, grown.size, true))
                .unwrap();
            Ok(self.free.allocate(size).unwrap())
        }
    }

    /// RMM's `PoolTest.ForceGrowth`, without a maximum pool size.
    #[test]
    fn force_growth_unbounded() {
        let mut pool = ModelPool::new(6000, None);
        pool.allocate(1000).unwrap();
        pool.allocate(4000).unwrap();
        pool.allocate(500).unwrap();
        let sizes: Vec<usize> = pool.chunks.iter().map(|c| c.1).collect();
        assert_eq!(sizes, [1024, 4096, 640]);
        assert_eq!(
            pool.upstream_log,
            [
                (1024, true),
                (4096, true),
                (5120, false),
                (2560, false),
                (1280, false),
                (640, true)
            ]
        );
        assert_eq!(pool.pool_size, 5760);
        let err = pool.allocate(2000).unwrap_err();
        assert_eq!(err.min_size, 2048);
        assert!(matches!(err.reason, GrowthFailure::Upstream(_)));
        assert!(err
            .to_string()
            .starts_with("Maximum pool size exceeded (failed to allocate 2.000000 KiB): "));
        assert_eq!(pool.pool_size, 5760);
        assert_eq!(pool.free.total_bytes(), 128);
    }

    /// RMM's `PoolTest.ForceGrowth`, with a maximum pool size of 8192.
    #[test]
    fn force_growth_bounded() {
        let mut pool = ModelPool::new(6000, Some(8192));
        pool.allocate(1000).unwrap();
        assert_eq!(pool.chunks.iter().map(|c| c.1).collect::<Vec<_>>(), [4096]);
        let err = pool.allocate(4000).unwrap_err();
        assert_eq!(err.min_size, 4096);
        assert_eq!(pool.upstream_log, [(4096, true), (4096, false)]);
        pool.allocate(500).unwrap();
        pool.allocate(2000).unwrap();
        assert_eq!(pool.chunks.len(), 1);
        assert_eq!(pool.free.total_bytes(), 4096 - 1024 - 512 - 2048);
        // Now the headroom (4096) is too small for 8192 bytes: no upstream call at all.
        let calls = pool.upstream_log.len();
        let err = pool.allocate(8192).unwrap_err();
        assert_eq!(pool.upstream_log.len(), calls);
        assert_eq!(
            err.to_string(),
            "Maximum pool size exceeded (failed to allocate 8.000000 KiB): Not enough room to \
             grow, current/max/try size = 4.000000 KiB, 8.000000 KiB, 8.000000 KiB"
        );
    }

    proptest! {
        #[test]
        fn plan_is_decreasing_and_ends_at_min(try_size in 0usize..1 << 40, min in 0usize..1 << 40) {
            let plan: Vec<usize> = GrowthPlan::new(try_size, min).collect();
            if try_size < min {
                prop_assert!(plan.is_empty());
            } else {
                prop_assert_eq!(plan[0], try_size);
                prop_assert_eq!(*plan.last().unwrap(), min);
                for w in plan.windows(2) {
                    prop_assert!(w[1] < w[0]);
                    prop_assert_eq!(w[1], min.max(w[0] / 2));
                }
            }
        }

        #[test]
        fn growth_respects_maximum(
            pool in 0usize..1 << 30,
            extra in 0usize..1 << 30,
            request in 1usize..1 << 31,
        ) {
            let maximum = align_up(pool + extra, ALLOCATION_ALIGNMENT);
            let grow = size_to_grow(pool, request, Some(maximum));
            let aligned = align_up(request, ALLOCATION_ALIGNMENT);
            if grow == 0 {
                prop_assert!(aligned > align_up(maximum - pool, ALLOCATION_ALIGNMENT));
            } else {
                prop_assert!(grow >= aligned);
                prop_assert!(pool + grow <= align_up(maximum, ALLOCATION_ALIGNMENT) + 255);
            }
            prop_assert!(size_to_grow(pool, request, None) >= request.max(pool));
        }

        /// Under pressure the pool takes exactly the rounded request when the maximum allows
        /// it, never more than RMM's rule, and fails exactly where RMM's rule fails.
        #[test]
        fn pressure_takes_the_request_and_fails_like_rmm(
            pool in 0usize..1 << 40,
            extra in 0usize..1 << 40,
            units in 1usize..1 << 30,
            bounded in any::<bool>(),
        ) {
            let request = units * ALLOCATION_ALIGNMENT;
            let maximum = bounded.then(|| align_up(pool + extra, ALLOCATION_ALIGNMENT));
            let ordinary = size_to_grow(pool, request, maximum);
            let pressure = size_under_pressure(pool, request, maximum);
            prop_assert!(pressure <= ordinary);
            prop_assert_eq!(pressure == 0, ordinary == 0);
            if pressure != 0 {
                prop_assert_eq!(pressure, request);
            }
            // The halving plan then asks the upstream for the request alone.
            prop_assert_eq!(
                GrowthPlan::new(pressure, request).collect::<Vec<_>>(),
                if pressure == 0 { vec![] } else { vec![request] }
            );
        }
    }
}
