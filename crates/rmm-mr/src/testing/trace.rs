//! Allocation traces the benchmarks replay: allocations into numbered slots and frees of what
//! a slot holds, generated ahead of time from a seed so that every resource (and RMM C++, in
//! the peer comparison) replays the same operations. `rmm_benches::Trace` wraps them;
//! rmm-mr's own `pair_count` bench replays the peer comparison's traces from them.

use super::Rng;

/// One step of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes into `slot`.
    Alloc {
        /// The slot that holds the pointer until it is freed.
        slot: u32,
        /// Bytes to allocate.
        size: usize,
    },
    /// Free what `slot` holds.
    Free {
        /// The slot.
        slot: u32,
    },
}

/// `ops` operations (allocations and frees together, final frees included) with sizes uniform
/// in `[min_size, max_size]` and about `live` allocations outstanding: below `live` it
/// allocates, above it frees, at `live` it flips a coin; the last `live` operations free
/// whatever is left. Returns the operations and the number of slots they use.
#[must_use]
pub fn random(
    ops: usize,
    min_size: usize,
    max_size: usize,
    live: usize,
    seed: u64,
) -> (Vec<Op>, usize) {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(ops);
    let mut free_slots: Vec<u32> = Vec::new();
    let mut used: Vec<u32> = Vec::new();
    let mut slots = 0u32;
    while out.len() + used.len() < ops {
        let alloc = used.len() < live || (used.len() == live && rng.next_u64() & 1 == 0);
        if alloc {
            let slot = free_slots.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            out.push(Op::Alloc {
                slot,
                size: rng.range(min_size, max_size),
            });
            used.push(slot);
        } else {
            let i = rng.range(0, used.len() - 1);
            let slot = used.swap_remove(i);
            out.push(Op::Free { slot });
            free_slots.push(slot);
        }
    }
    out.extend(used.into_iter().map(|slot| Op::Free { slot }));
    (out, slots as usize)
}

/// RMM's `random_allocations` sequence (`random_allocation_free` in RMM's
/// `random_allocations.cpp`): `2 * num_allocations` steps; the first step, and every step with
/// nothing live, allocates; otherwise a step allocates with probability 73 % while fewer than
/// `num_allocations` were made and the live bytes plus the new size stay below `max_usage`,
/// and frees a random live allocation otherwise; what is live at the end is freed in
/// allocation order. Sizes are uniform in `[1, max_size]`. Returns the operations and the
/// number of slots they use.
///
/// Differences from RMM, all documented in `docs/performance.md` ("RMM's benchmark set"): the generator is [`Rng`]
/// (splitmix64) rather than `std::default_random_engine`; the freed entry is removed by
/// swapping with the last (RMM erases in place, which is quadratic at 100,000 allocations);
/// and since nothing is allocated while generating, an allocation cannot fail and turn into a
/// free as it can in RMM, so `max_size` is clamped to `max_usage` (the live bytes then never
/// exceed `max_usage`, and the callers size `max_usage` to fit the device).
#[must_use]
pub fn rmm_random(
    num_allocations: usize,
    max_size: usize,
    max_usage: usize,
    seed: u64,
) -> (Vec<Op>, usize) {
    const ALLOCATION_PROBABILITY: usize = 73; // percent
    let max_size = max_size.min(max_usage).max(1);
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(3 * num_allocations);
    let mut free_slots: Vec<u32> = Vec::new();
    // Live allocations: (slot, size).
    let mut live: Vec<(u32, usize)> = Vec::new();
    let (mut slots, mut count, mut live_bytes) = (0u32, 0usize, 0usize);
    for _ in 0..2 * num_allocations {
        let size = rng.range(1, max_size);
        let alloc = live.is_empty() || {
            let chance = rng.range(0, 99);
            chance < ALLOCATION_PROBABILITY
                && count < num_allocations
                && live_bytes + size < max_usage
        };
        if alloc {
            let slot = free_slots.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            out.push(Op::Alloc { slot, size });
            live.push((slot, size));
            count += 1;
            live_bytes += size;
        } else {
            let index = rng.range(0, num_allocations.max(1) - 1) % live.len();
            let (slot, size) = live.swap_remove(index);
            out.push(Op::Free { slot });
            free_slots.push(slot);
            live_bytes -= size;
        }
    }
    // What is left, in the order it sits in the live list (RMM frees its vector in order).
    out.extend(live.into_iter().map(|(slot, _)| Op::Free { slot }));
    (out, slots as usize)
}
