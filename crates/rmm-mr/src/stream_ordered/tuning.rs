//! The tuning knobs of the stream-ordered core, in one place, each with the measurement that
//! chose it (or the plain statement that none did). The protocols they tune:
//! `docs/internals/stream-ordered.md` ("Blocks in transit" for the grower's waits, "The lazy
//! event rule as a state machine" for the events, "Algorithm" for stealing); the table of the
//! knobs with the runs behind each figure: same page, "Tuning knobs".
//!
//! Not here: the parameters of the data structures, whose values are facts about a structure
//! rather than choices about a protocol, stay private beside the structure that they size (the
//! per-thread list cache's slots, `stream_lists.rs`; the record's shards,
//! `pool/engine/handed.rs`; the address tables' load, `pool/engine/addr_table.rs`; the size
//! classes, `pool/engine/size_index.rs`).

use std::time::Duration;

// The grower's waits under the growth lock (`moves.rs`).

/// How many times a grower searches again, after merges or frees left a fitting block, before it
/// grows anyway (other threads may take each such block first). Measured before the epochs
/// (the pool on `r64` at 16 threads on an H100): 64
/// kept the peak at or below RMM's 40097 MiB in every run, 0 let it reach 52448-80194 MiB in four
/// of seven; fewer tries were faster then because every try was a full search. Since the epochs
/// a grower searches again only when a fitting block landed, and the value was not measured
/// again.
pub(crate) const SETTLE_TRIES: u32 = 64;

/// How many times a grower yields while waiting for the merges of its epoch to land before it
/// grows anyway: a bound for a merger preempted between its two locks, not a measured value
/// (no run has shown a grower reach it).
pub(crate) const DRAIN_SPINS: u32 = 1 << 12;

/// How many times at most a grower whose miss was real (no merge hid a fitting block) yields,
/// waiting for a free or a merge to leave a fitting block, before it grows: growing doubles the
/// pool, and at 16 threads other threads' frees often leave such a block within a millisecond.
/// Measured with 0, 64, 256, 1024 and 4096 (H100, 5-16 runs each): 1024 kept the pool on `a` at 16 threads at RMM's 54824 MiB in 10 of 10 runs
/// (0-256: 1-2 of 5-10) and binning on `r64` at RMM's 31744 in 15 of 16; 4096 did as well on
/// memory with slower outliers.
pub(crate) const PATIENCE: u32 = 1024;

/// The grower stops waiting early when no free at all happened in this many yields (one thread
/// alone, or threads that only allocate: nothing will come). Chosen with [`PATIENCE`] so that a
/// lone thread does not wait 1024 yields at each growth; no other value was measured.
pub(crate) const IDLE_WINDOW: u32 = 32;

/// The most wall time a grower spends waiting for one growth, counted from when it took the
/// growth lock. Not measured against other values: 1,024 yields take about a millisecond at 16
/// threads on a 16-core host, so a wait that fits [`WAIT_YIELDS`] on an idle host is not cut,
/// while an oversubscribed host, where a yield can take a time slice, is. On an H200 (trace
/// `r64`, 16 threads) no hold ran out of budget, and the most yields in one hold was 286.
pub(crate) const WAIT_TIME: Duration = Duration::from_millis(5);

/// The most yields a grower makes in all while it holds the growth lock for one growth (the
/// drain waits and the patience of every search together): one full drain wait and one full
/// patience, what a single settle could take before the budget existed. Derived, not a knob.
pub(crate) const WAIT_YIELDS: u32 = DRAIN_SPINS + PATIENCE;

// The lazy event rule (`event_policy.rs`).

/// Frees that record after a thief took from a list or asked it to record. Measured against 64
/// and 16 (H100): fewer recording frees cut the
/// event records from 120-196 to 38-57 per 1,000 operations, but took the pool's reserved / live
/// on `a` at 4 threads from 3.28 to 6.57 (64) and 8.21 (16), which the memory target forbids.
pub(crate) const RECORD_RUN: u32 = 256;

/// How long a thief's request may wait for the owner before a thief synchronizes the device.
/// Not measured on a GPU; in the lockstep simulation 0 (synchronize at once) gave the same peak
/// as 2 ms.
pub(crate) const OWNER_GRACE: Duration = Duration::from_millis(2);

/// Events the orphan list waits on at most; beyond, its next thief synchronizes the device. A
/// bound on one list's events (the blocks of retired lists are rare), not a measured value.
pub(crate) const MAX_ORPHAN_WAITS: usize = 8;

// Stealing.

/// The most blocks a list of equal blocks (the fixed-size resource's) hands a thief beside the
/// one it took, half its other blocks at most. Measured (H100): with 32, fixed-size's stream waits at 16 threads fell from 53 to 4 per
/// 1,000 operations; other values were not tried.
pub(crate) const THIEF_SHARE: usize = 32;

/// How often an allocation that found the resource full waits for synchronizations in flight
/// and looks again before it reports out-of-memory: a bound on a cold path, not a measured value.
pub(crate) const FULL_RETRIES: usize = 3;
