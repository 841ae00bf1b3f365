//! Sizing every benchmark from the device's memory, so that one run completes on an 80 GB
//! H100 as well as on a 141 GB H200 (and on smaller GPUs, with smaller figures).
//!
//! The functions here are pure (they take the byte counts); [`DeviceMemory::query`] reads
//! them from the device (`rmm_sys::available_device_memory`, `DeviceId::total_memory`).

use rmm_mr::MrResult;

/// One MiB.
pub const MIB: usize = 1 << 20;
/// One GiB.
pub const GIB: usize = 1 << 30;

/// RMM's `max_usage` in `random_allocations`: 16,000 MiB.
pub const RMM_MAX_USAGE: usize = 16_000 * MIB;

/// The occupancy of the arena (all threads' live bytes at their peak over the arena size, in
/// percent) the benchmarks size their traces for: well below the 90 % at which 16 copies of
/// `gpu_alloc`'s trace (a) still complete (`arena_capacity`, `docs/reliability.md`).
pub const ARENA_OCCUPANCY_TARGET: usize = 75;

/// Free and total memory of the current device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Free bytes now.
    pub free: usize,
    /// Total bytes of the device.
    pub total: usize,
}

impl DeviceMemory {
    /// Reads the current device's free and total memory.
    pub fn query() -> MrResult<Self> {
        let (free, total) = rmm_sys::available_device_memory()?;
        let total = total.max(rmm_sys::current_device()?.total_memory()?);
        Ok(Self { free, total })
    }

    /// The bytes that live allocations of one benchmark row may reach, all threads together:
    /// RMM's 16,000 MiB where 40 % of the device holds it (80 GB GPUs and up), 40 % of the
    /// device otherwise, and never more than half of what is free now. The rest is headroom
    /// for what the resources keep beyond the live bytes (fragmentation, per-stream free lists,
    /// the driver pool's granularity).
    #[must_use]
    pub fn live_budget(&self) -> usize {
        let by_total = self.total / 5 * 2;
        round_down(RMM_MAX_USAGE.min(by_total).min(self.free / 2), MIB)
    }

    /// The arena size the benchmarks give `ArenaMemoryResource` (and RMM's
    /// `arena_memory_resource` in the peer comparison): 90 % of what is free now, rounded down
    /// to 2 MiB, leaving at least 1 GiB. RMM's own benchmark uses all free memory but 64 MiB;
    /// the arena's default, half of the free memory, is too small for 16 threads of trace (a)
    /// on an 80 GB GPU.
    #[must_use]
    pub fn arena_bytes(&self) -> usize {
        let keep = (self.free / 10).max(GIB);
        round_down(self.free.saturating_sub(keep), 2 * MIB)
    }

    /// The bytes all threads' live allocations of one `gpu_alloc` trace may reach together:
    /// 60 % of the free memory (the rest is headroom for what the resources keep beyond the
    /// live bytes), and at most [`ARENA_OCCUPANCY_TARGET`] % of [`arena_bytes`](Self::arena_bytes),
    /// so that the arena row runs at that occupancy or below on any GPU.
    #[must_use]
    pub fn trace_budget(&self) -> usize {
        (self.free / 10 * 6).min(self.arena_bytes() / 100 * ARENA_OCCUPANCY_TARGET)
    }

    /// RMM's pool configuration in its benchmarks: initial size 50 % of the free memory,
    /// rounded down to 256 bytes (`percent_of_free_device_memory(50)`).
    #[must_use]
    pub fn half_free(&self) -> usize {
        round_down(self.free / 2, 256)
    }
}

/// `bytes` rounded down to a multiple of `unit` (a power of two or not).
#[must_use]
pub fn round_down(bytes: usize, unit: usize) -> usize {
    bytes.checked_div(unit).map_or(bytes, |n| n * unit)
}

/// The number of live allocations a trace of sizes uniform in `[1, max_size]` may keep per
/// thread so that `threads` copies stay within `budget` bytes at their peak: `wanted` where it
/// fits, fewer otherwise (at least 1). The peak of such a trace is about `live * max_size / 2`
/// bytes; a margin of 25 % covers the random excess of the peak over the mean.
#[must_use]
pub fn live_count_within(wanted: usize, max_size: usize, threads: usize, budget: usize) -> usize {
    let per_thread = budget / threads.max(1);
    let mean = (max_size / 2).max(1);
    let fits = per_thread / 5 * 4 / mean;
    wanted.min(fits).max(1)
}

/// Bytes as GiB with two decimals.
#[must_use]
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: DeviceMemory = DeviceMemory {
        free: 80_500 * MIB,
        total: 81_559 * MIB,
    };
    const H200: DeviceMemory = DeviceMemory {
        free: 142_000 * MIB,
        total: 143_771 * MIB,
    };

    #[test]
    fn live_budget_is_rmms_on_big_gpus_and_shrinks_on_small_ones() {
        assert_eq!(H100.live_budget(), RMM_MAX_USAGE);
        assert_eq!(H200.live_budget(), RMM_MAX_USAGE);
        let small = DeviceMemory {
            free: 15 * GIB,
            total: 16 * GIB,
        };
        assert_eq!(small.live_budget(), round_down(16 * GIB / 5 * 2, MIB));
        let busy = DeviceMemory {
            free: 10 * GIB,
            total: 80 * GIB,
        };
        assert_eq!(busy.live_budget(), 5 * GIB);
    }

    #[test]
    fn arena_leaves_headroom_and_is_aligned() {
        for m in [H100, H200] {
            let a = m.arena_bytes();
            assert_eq!(a % (2 * MIB), 0);
            assert!(a <= m.free - GIB && a >= m.free / 10 * 8, "{a}");
            // 16 threads of trace (a) (about 2.05 GiB live each) fit with room to spare.
            assert!(a > 16 * 2100 * MIB + 30 * GIB, "{a}");
        }
        let tiny = DeviceMemory {
            free: 512 * MIB,
            total: GIB,
        };
        assert_eq!(tiny.arena_bytes(), 0);
        assert_eq!(H100.half_free() % 256, 0);
    }

    /// Trace (a) of `gpu_alloc` on 16 threads fits its budget, and so the arena at the target
    /// occupancy, on every size of GPU.
    #[test]
    fn trace_a_fits_the_arena_at_the_target_occupancy() {
        let small = DeviceMemory {
            free: 15 * GIB,
            total: 16 * GIB,
        };
        let busy = DeviceMemory {
            free: 6 * GIB,
            total: 80 * GIB,
        };
        for m in [H100, H200, small, busy] {
            let budget = m.trace_budget();
            assert!(budget <= m.free / 10 * 6);
            assert!(budget <= m.arena_bytes() / 100 * ARENA_OCCUPANCY_TARGET);
            let live = live_count_within(1000, 4 * MIB, 16, budget);
            // The peak of a copy is about live x 2 MiB, at most 25 % more.
            let peak = live * 2 * MIB / 4 * 5;
            assert!(
                16 * peak <= m.arena_bytes() / 100 * ARENA_OCCUPANCY_TARGET,
                "{m:?}"
            );
        }
        assert_eq!(
            live_count_within(1000, 4 * MIB, 16, H100.trace_budget()),
            1000
        );
        assert_eq!(H100.trace_budget(), H100.free / 10 * 6);
    }

    #[test]
    fn live_counts_fit_the_budget() {
        // Trace (a) of gpu_alloc (budget: 60 % of free memory): the documented 1,000 live
        // allocations fit 16 threads on an H100.
        assert_eq!(
            live_count_within(1000, 4 * MIB, 16, H100.free / 10 * 6),
            1000
        );
        // On a 16 GB GPU fewer.
        let small = live_count_within(1000, 4 * MIB, 16, 15 * GIB / 10 * 6);
        assert!(small < 1000 && small > 100, "{small}");
        assert!(16 * small * 2 * MIB <= 15 * GIB / 10 * 6);
        assert_eq!(live_count_within(10, GIB, 16, MIB), 1);
        assert_eq!(round_down(1000, 0), 1000);
        assert_eq!(gib(3 * GIB as u64 / 2), "1.50 GiB");
    }
}
