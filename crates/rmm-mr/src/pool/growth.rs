//! The pool's growth policy (RMM's `pool_memory_resource`: the constructor checks,
//! `size_to_grow`, `try_to_expand` and its out-of-memory message).
//!
//! - [`check_sizes`] validates the constructor's initial and maximum sizes.
//! - [`size_to_grow`] picks the size of the next upstream chunk: without a maximum the pool at
//!   least doubles; with one, it takes half the remaining headroom (or the request if larger),
//!   and 0 means there is no room at all.
//! - [`try_to_expand`] runs RMM's halving retry against any upstream closure, building RMM's
//!   out-of-memory message on failure.
//!
//! Pure bookkeeping: no CUDA calls. The caller rounds requests up to 256 bytes before asking
//! for growth, as RMM does.

use std::fmt;

use rmm_sys::align::{align_up, checked_align_up, is_aligned, ALLOCATION_ALIGNMENT};

use crate::util::format::format_bytes;

/// RMM's constructor checks of the initial and maximum pool sizes, in its order and with its
/// messages (RMM throws `rmm::logic_error`): `initial` a multiple of 256, `maximum` (if any) a
/// multiple of 256, then `initial <= maximum`. `initial == 0` is allowed (the pool grows
/// lazily); `maximum == None` means unbounded.
pub(crate) fn check_sizes(initial: usize, maximum: Option<usize>) -> Result<(), &'static str> {
    if !is_aligned(initial, ALLOCATION_ALIGNMENT) {
        return Err("Error, Initial pool size required to be a multiple of 256 bytes");
    }
    match maximum {
        Some(maximum) if !is_aligned(maximum, ALLOCATION_ALIGNMENT) => {
            Err("Error, Maximum pool size required to be a multiple of 256 bytes")
        }
        Some(maximum) if initial > maximum => {
            Err("Initial pool size exceeds the maximum pool size!")
        }
        _ => Ok(()),
    }
}

/// The size of the next upstream chunk for a pool of `pool_size` bytes that cannot serve
/// `request` bytes from its free lists; 0 when the maximum leaves no room for the request.
///
/// - With a maximum: `remaining = align_up(maximum - pool_size, 256)`; if
///   `align_up(request, 256) <= remaining` the result is the larger of that and
///   `remaining / 2`, else 0.
/// - Without: `max(request, pool_size)`, so the pool at least doubles.
pub(crate) fn size_to_grow(pool_size: usize, request: usize, maximum: Option<usize>) -> usize {
    match maximum {
        Some(maximum) => {
            let remaining = align_up(maximum.saturating_sub(pool_size), ALLOCATION_ALIGNMENT);
            match checked_align_up(request, ALLOCATION_ALIGNMENT) {
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
/// maximum. (A 1 GiB pool without a maximum asked for 1000 bytes: RMM's rule doubles the pool,
/// pressure takes 1 KiB.)
pub(crate) fn size_under_pressure(
    pool_size: usize,
    request: usize,
    maximum: Option<usize>,
) -> usize {
    // The request, rounded, wherever RMM's rule would grow at all (its maximum check).
    match checked_align_up(request, ALLOCATION_ALIGNMENT) {
        Some(aligned) if size_to_grow(pool_size, request, maximum) != 0 => aligned,
        _ => 0,
    }
}

/// RMM's `try_to_expand`: asks `upstream` for `try_size` bytes, then, on each refusal, for
/// half the last size but at least `min_size`, ending with `min_size` (5120 and 512: 5120,
/// 2560, 1280, 640, 512; sizes after the first may not be multiples of 256, RMM's neither),
/// and returns the first chunk granted with its size. `pool_size` and `maximum` only feed the
/// message.
///
/// # Errors
///
/// RMM's out-of-memory message, `"Maximum pool size exceeded (failed to allocate <min_size>):
/// <reason>"`, with the upstream's last error, whose text is the reason; when `try_size <
/// min_size` (e.g. [`size_to_grow`] returned 0) the upstream is not asked and the reason is
/// `"Not enough room to grow, current/max/try size = <pool_size>, <maximum>, <min_size>"`
/// (no maximum printed as `SIZE_MAX`, like RMM).
pub(crate) fn try_to_expand<T, E: fmt::Display>(
    try_size: usize,
    min_size: usize,
    pool_size: usize,
    maximum: Option<usize>,
    mut upstream: impl FnMut(usize) -> Result<T, E>,
) -> Result<(T, usize), (String, Option<E>)> {
    let mut last = None;
    let plan = std::iter::successors((try_size >= min_size).then_some(try_size), |&size| {
        (size > min_size).then(|| min_size.max(size / 2))
    });
    for size in plan {
        match upstream(size) {
            Ok(chunk) => return Ok((chunk, size)),
            Err(e) => last = Some(e),
        }
    }
    let reason = match &last {
        Some(e) => e.to_string(),
        None => format!(
            "Not enough room to grow, current/max/try size = {}, {}, {}",
            format_bytes(pool_size),
            format_bytes(maximum.unwrap_or(usize::MAX)),
            format_bytes(min_size)
        ),
    };
    let message = format!(
        "Maximum pool size exceeded (failed to allocate {}): {reason}",
        format_bytes(min_size)
    );
    Err((message, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::coalescing_model::{Block, CoalescingFreeList};
    use proptest::prelude::*;

    /// The sizes [`try_to_expand`] asks an upstream that refuses everything for.
    fn plan(try_size: usize, min_size: usize) -> Vec<usize> {
        let mut tried = Vec::new();
        let _ = try_to_expand(try_size, min_size, 0, None, |s| {
            tried.push(s);
            Err::<(), _>("no")
        });
        tried
    }

    #[test]
    fn size_checks_and_messages() {
        assert_eq!(check_sizes(0, None), Ok(()));
        assert_eq!(check_sizes(1024, Some(1024)), Ok(()));
        assert_eq!(
            check_sizes(1000, None),
            Err("Error, Initial pool size required to be a multiple of 256 bytes")
        );
        assert_eq!(
            check_sizes(1024, Some(2000)),
            Err("Error, Maximum pool size required to be a multiple of 256 bytes")
        );
        assert_eq!(
            check_sizes(2048, Some(1024)),
            Err("Initial pool size exceeds the maximum pool size!")
        );
        // RMM checks alignment before the order of the two sizes.
        assert_eq!(check_sizes(2000, Some(1024)), check_sizes(2000, None));
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
        // A 1 GiB pool without a maximum at least doubles.
        assert_eq!(size_to_grow(1 << 30, 1000, None), 1 << 30);
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
        assert_eq!(size_under_pressure(4096, 1000, Some(8192)), 1024);
    }

    #[test]
    fn plan_halves_down_to_min() {
        assert_eq!(plan(5120, 512), [5120, 2560, 1280, 640, 512]);
        assert_eq!(plan(5760, 2048), [5760, 2880, 2048]);
        assert_eq!(plan(4096, 4096), [4096]);
        assert_eq!(plan(0, 256).len(), 0);
        assert_eq!(plan(1000, 1).last(), Some(&1));
        assert_eq!(plan(0, 0), [0]);
    }

    #[test]
    fn try_to_expand_messages() {
        let (err, last) =
            try_to_expand(5760, 2048, 5760, None, |_| Err::<(), _>("out of memory")).unwrap_err();
        assert_eq!(
            err,
            "Maximum pool size exceeded (failed to allocate 2.000000 KiB): out of memory"
        );
        assert_eq!(last, Some("out of memory"));
        let (err, last) =
            try_to_expand(0, 256, 1024, Some(1024), |_| Ok::<_, String>(())).unwrap_err();
        assert_eq!(last, None, "the upstream was not asked");
        assert_eq!(
            err,
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
        assert_eq!(grown, (0xdead_0000, 2048));
    }

    /// A model pool (one free list, growth policy) over an upstream that refuses to hand out
    /// more than `limit` bytes in total, like RMM's `limiting_resource_adaptor`.
    struct ModelPool {
        maximum: Option<usize>,
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
                maximum,
                free: CoalescingFreeList::new(),
                pool_size: 0,
                used_upstream: 0,
                limit,
                next_addr: 1 << 30,
                upstream_log: Vec::new(),
                chunks: Vec::new(),
            }
        }

        fn allocate(&mut self, bytes: usize) -> Result<Block, (String, Option<&'static str>)> {
            let size = align_up(bytes, ALLOCATION_ALIGNMENT);
            if let Some(b) = self.free.allocate(size) {
                return Ok(b);
            }
            let grow = size_to_grow(self.pool_size, size, self.maximum);
            let (used, limit, next_addr, log) = (
                &mut self.used_upstream,
                self.limit,
                &mut self.next_addr,
                &mut self.upstream_log,
            );
            let (chunk, grown) = try_to_expand(grow, size, self.pool_size, self.maximum, |s| {
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
            self.pool_size += grown;
            self.chunks.push((chunk, grown));
            self.free.insert(Block::new(chunk, grown, true)).unwrap();
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
        let (err, last) = pool.allocate(2000).unwrap_err();
        assert_eq!(
            last,
            Some("std::bad_alloc: out_of_memory"),
            "the upstream refused"
        );
        assert_eq!(
            err,
            "Maximum pool size exceeded (failed to allocate 2.000000 KiB): \
             std::bad_alloc: out_of_memory"
        );
        assert_eq!(pool.pool_size, 5760);
        assert_eq!(pool.free.total_bytes(), 128);
    }

    /// RMM's `PoolTest.ForceGrowth`, with a maximum pool size of 8192.
    #[test]
    fn force_growth_bounded() {
        let mut pool = ModelPool::new(6000, Some(8192));
        pool.allocate(1000).unwrap();
        assert_eq!(pool.chunks.iter().map(|c| c.1).collect::<Vec<_>>(), [4096]);
        let (err, _) = pool.allocate(4000).unwrap_err();
        assert!(err.contains("(failed to allocate 4.000000 KiB)"), "{err}");
        assert_eq!(pool.upstream_log, [(4096, true), (4096, false)]);
        pool.allocate(500).unwrap();
        pool.allocate(2000).unwrap();
        assert_eq!(pool.chunks.len(), 1);
        assert_eq!(pool.free.total_bytes(), 4096 - 1024 - 512 - 2048);
        // Now the headroom (4096) is too small for 8192 bytes: no upstream call at all.
        let calls = pool.upstream_log.len();
        let (err, _) = pool.allocate(8192).unwrap_err();
        assert_eq!(pool.upstream_log.len(), calls);
        assert_eq!(
            err,
            "Maximum pool size exceeded (failed to allocate 8.000000 KiB): Not enough room to \
             grow, current/max/try size = 4.000000 KiB, 8.000000 KiB, 8.000000 KiB"
        );
    }

    proptest! {
        #[test]
        fn plan_is_decreasing_and_ends_at_min(try_size in 0usize..1 << 40, min in 0usize..1 << 40) {
            let plan = plan(try_size, min);
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
                plan(pressure, request),
                if pressure == 0 { vec![] } else { vec![request] }
            );
        }
    }
}
