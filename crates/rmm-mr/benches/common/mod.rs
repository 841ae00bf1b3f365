//! What the host hot-path benches share: the do-nothing upstream, the fixed pseudo-random
//! sequences and their sizes (`suballocator_hot_path.rs`, `pair_count.rs`).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use rmm_mr::{DeviceMemoryResource, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

/// Allocations held live.
pub(crate) const LIVE: usize = 1000;

/// Length of the pre-drawn size and slot sequences (a power of two).
pub(crate) const SEQ: usize = 1 << 14;

/// Allocations every [`NullUpstream`] has made (whether a measured loop grew a pool).
#[allow(dead_code)] // Not every bench target reads it.
pub(crate) static UPSTREAM_CALLS: AtomicU64 = AtomicU64::new(0);

/// A resource that does no work: distinct 256-aligned fake addresses from a bump counter
/// (never reused, never dereferenced); `deallocate` is a no-op.
#[derive(Debug)]
pub(crate) struct NullUpstream {
    next: AtomicU64,
}

impl NullUpstream {
    pub(crate) fn new() -> Self {
        Self {
            next: AtomicU64::new(1 << 40),
        }
    }
}

// SAFETY: a benchmark double handing out fake addresses. That breaks the promise of valid
// memory, which is sound only because this benchmark never touches the memory.
unsafe impl DeviceMemoryResource for NullUpstream {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        UPSTREAM_CALLS.fetch_add(1, Ordering::Relaxed);
        let step = (bytes as u64).div_ceil(256) * 256;
        Ok(DevicePtr::from_raw(
            self.next.fetch_add(step, Ordering::Relaxed),
        ))
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        _ptr: DevicePtr,
        _bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        Ok(())
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        std::ptr::eq(
            self as *const Self as *const u8,
            other.as_any() as *const dyn Any as *const u8,
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// xorshift64*: a fixed, reproducible sequence.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `SEQ` sizes uniform in `1..=max` and `SEQ` slot numbers below `LIVE`.
pub(crate) fn sequences(max: usize) -> (Vec<usize>, Vec<usize>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ max as u64);
    let sizes = (0..SEQ).map(|_| 1 + (rng.next() as usize) % max).collect();
    let slots = (0..SEQ).map(|_| (rng.next() as usize) % LIVE).collect();
    (sizes, slots)
}

/// The peer comparison's traces (`rmm_benches::peer::standard_plan` for an 80 GB GPU at its
/// default 20,000 operations and 16 threads), copied here because rmm-benches depends on this
/// crate: the same generators ([`TraceRng`] is `rmm_benches::Rng`, splitmix64), parameters and
/// seeds, so the same operations. `rmm_benches`'s test `pair_count_traces_match` pins the
/// fingerprint [`fingerprint`] computes for each.
#[allow(dead_code)] // Each bench target uses its own part of the module.
pub(crate) mod traces {
    const MIB: usize = 1 << 20;

    /// One operation: allocate `size` bytes into a slot, or free what a slot holds.
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum Op {
        Alloc { slot: u32, size: usize },
        Free { slot: u32 },
    }

    /// splitmix64 (`rmm_benches::Rng`).
    struct TraceRng(u64);

    impl TraceRng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn range(&mut self, lo: usize, hi: usize) -> usize {
            lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
        }
    }

    /// `rmm_benches::Trace::random`.
    fn random(ops: usize, min: usize, max: usize, live: usize, seed: u64) -> (Vec<Op>, usize) {
        let mut rng = TraceRng(seed);
        let (mut out, mut free_slots, mut used) = (Vec::with_capacity(ops), Vec::new(), Vec::new());
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
                    size: rng.range(min, max),
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

    /// `rmm_benches::Trace::rmm_random` (RMM's `random_allocations`).
    fn rmm_random(n: usize, max_size: usize, max_usage: usize, seed: u64) -> (Vec<Op>, usize) {
        let max_size = max_size.min(max_usage).max(1);
        let mut rng = TraceRng(seed);
        let (mut out, mut free_slots) = (Vec::new(), Vec::new());
        let mut live: Vec<(u32, usize)> = Vec::new();
        let (mut slots, mut count, mut live_bytes) = (0u32, 0usize, 0usize);
        for _ in 0..2 * n {
            let size = rng.range(1, max_size);
            let alloc = live.is_empty() || {
                let chance = rng.range(0, 99);
                chance < 73 && count < n && live_bytes + size < max_usage
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
                let index = rng.range(0, n.max(1) - 1) % live.len();
                let (slot, size) = live.swap_remove(index);
                out.push(Op::Free { slot });
                free_slots.push(slot);
                live_bytes -= size;
            }
        }
        out.extend(live.into_iter().map(|(slot, _)| Op::Free { slot }));
        (out, slots as usize)
    }

    /// [`fingerprint`] of each trace [`peer`] makes; rmm-benches's test
    /// `pair_count_traces_match` pins the same figures for its own generators.
    pub(crate) const PINNED: [(&str, (usize, usize, usize)); 4] = [
        ("a", (20_000, 21_078_149_594, 1001)),
        ("b", (20_000, 324_932_589, 2001)),
        ("r1", (20_000, 4_685_516_381, 2395)),
        ("r64", (20_000, 281_108_201_673, 49)),
    ];

    /// The peer workload `name` (`a`, `b`, `r1`, `r64`) as the standard plan makes it for an
    /// H100 80GB (79 GiB free: `a` and `b` at their full 1,000 and 2,000 live, `max_usage`
    /// 16,000 MiB / 16 threads = 1,000 MiB): the operations and the number of slots. Panics
    /// when the trace's [`fingerprint`] is not the one [`PINNED`].
    pub(crate) fn peer(name: &str) -> (Vec<Op>, usize) {
        let (ops, slots) = generate(name);
        let print = fingerprint(&ops, slots);
        let pinned = PINNED.iter().find(|(n, _)| *n == name).map(|&(_, p)| p);
        assert_eq!(
            Some(print),
            pinned,
            "trace {name}: not the peer comparison's"
        );
        (ops, slots)
    }

    fn generate(name: &str) -> (Vec<Op>, usize) {
        const OPS: usize = 20_000;
        const USAGE: usize = 16_000 * MIB / 16;
        match name {
            "a" => random(OPS, 1, 4 * MIB, 1000, 0xbe_2c4),
            "b" => random(OPS, 1, 64 << 10, 2000, 0xbe_2c5),
            "r1" => rmm_random(OPS / 2, MIB, USAGE, 0x5eed_0001),
            "r64" => rmm_random(OPS / 2, 64 * MIB, USAGE, 0x5eed_0040),
            other => panic!("unknown trace {other} (a, b, r1, r64)"),
        }
    }

    /// (operations, sum of the allocated sizes, slots): what the test in rmm-benches compares.
    pub(crate) fn fingerprint(ops: &[Op], slots: usize) -> (usize, usize, usize) {
        let bytes = ops
            .iter()
            .map(|op| match *op {
                Op::Alloc { size, .. } => size,
                Op::Free { .. } => 0,
            })
            .sum();
        (ops.len(), bytes, slots)
    }
}
