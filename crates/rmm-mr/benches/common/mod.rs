//! What the host hot-path benches share: the fixed pseudo-random sequences and their sizes
//! (`suballocator_hot_path.rs`, `pair_count.rs`); their do-nothing upstream is
//! `rmm_mr::testing::NullResource`.

use rmm_mr::testing::Rng;

/// Allocations held live.
pub(crate) const LIVE: usize = 1000;

/// Length of the pre-drawn size and slot sequences (a power of two).
pub(crate) const SEQ: usize = 1 << 14;

/// `SEQ` sizes uniform in `1..=max` and `SEQ` slot numbers below `LIVE`.
pub(crate) fn sequences(max: usize) -> (Vec<usize>, Vec<usize>) {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ max as u64);
    let sizes = (0..SEQ).map(|_| rng.range(1, max)).collect();
    let slots = (0..SEQ).map(|_| rng.below(LIVE)).collect();
    (sizes, slots)
}

/// The peer comparison's traces (`rmm_benches::peer::standard_plan` for an 80 GB GPU at its
/// default 20,000 operations and 16 threads), from the generators the peer comparison uses
/// (`rmm_mr::testing::trace`) with its parameters and seeds, which are repeated here because
/// rmm-benches depends on this crate: `rmm_benches`'s test `pair_count_traces_match` pins the
/// fingerprint [`fingerprint`] computes for each, so the two cannot drift apart.
#[cfg(feature = "testing")]
#[allow(dead_code)] // Each bench target uses its own part of the module.
pub(crate) mod traces {
    const MIB: usize = 1 << 20;

    pub(crate) use rmm_mr::testing::trace::Op;
    use rmm_mr::testing::trace::{random, rmm_random};

    /// The peer comparison's traces, by name.
    pub(crate) const NAMES: [&str; 4] = ["a", "b", "r1", "r64"];

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
