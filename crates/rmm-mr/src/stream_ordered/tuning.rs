//! The tuning knobs of the stream-ordered core, in one place, each with the measurement that
//! chose it (or the plain statement that none did). Four: the grower's patience, the one wall
//! time any thread waits for another, the recording run, the thief's share. The protocols they
//! tune: `docs/internals/stream-ordered.md` ("The grower's patience" for its waits, "The
//! lazy event rule as a state machine" for the events, "Algorithm" for stealing); the table of
//! the knobs with the runs behind each figure: same page, "Tuning knobs".
//!
//! Not here: the parameters of the data structures, whose values are facts about a structure
//! rather than choices about a protocol, stay private beside the structure that they size (the
//! per-thread list cache's slots and the orphan list's events, `stream_lists.rs`; the record's
//! shards, `pool/engine/handed.rs`; the address tables' load, `util/addr_table.rs`; the
//! size classes, `pool/engine/size_index.rs`).

use std::time::Duration;

/// The grower's wait budget (`patience.rs`): the most steps a grower takes while it holds the
/// growth lock for one growth, every wait of it together: a yield waiting for a fitting block
/// to land after a miss and a search again after one landed are one step each; past it the grower grows. Growing doubles
/// the pool, and at 16 threads other threads' frees often leave a fitting block within a
/// millisecond. Measured as the patience of one search with 0, 64, 256, 1024 and 4096 (H100,
/// 5-16 runs each): 1024 kept the pool on `a` at 16 threads at RMM's 54824 MiB in 10 of 10
/// runs (0-256: 1-2 of 5-10) and binning on `r64` at RMM's 31744 in 15 of 16; 4096 did as well
/// on memory with slower outliers. A whole hold fits in it: on an H200 (`r64`, 16 threads) the
/// most yields in one hold were 286, and a hold searched again 64 times at most then (the
/// bound before this budget counted searches).
pub(crate) const PATIENCE: u32 = 1024;

/// The grower stops waiting for a free early when no free at all happened in this many yields
/// (one thread alone, or threads that only allocate: nothing will come). Derived, not a knob:
/// a thirty-second of [`PATIENCE`], so that a lone thread waits 32 yields a growth, not 1024
/// (chosen with it; no other value was measured).
pub(crate) const IDLE_WINDOW: u32 = PATIENCE / 32;

/// The most wall time a thread waits for another thread's work before it takes the slow, sure
/// path: a grower for frees and merges under the growth lock (counted from when it took the
/// lock; then it grows), a thief for the owner of an unrecorded list to record (counted from
/// the thief's request; then the next thief synchronizes the device). Not measured against
/// other values: 1,024 yields take about a millisecond at 16 threads on a 16-core host, so a
/// grower's wait that fits [`PATIENCE`] on an idle host is not cut, while an oversubscribed
/// host, where a yield can take a time slice, is; on an H200 (trace `r64`, 16 threads) no hold
/// ran out of budget. For the thief, the lockstep simulation gave the same peak with no wait
/// (synchronize at once) as with 2 ms.
pub(crate) const WAIT_TIME: Duration = Duration::from_millis(5);

/// Frees that record after a thief took from a list or asked it to record (`event_policy.rs`).
/// Measured against 64 and 16 (H100): fewer recording frees cut the event records from 120-196
/// to 38-57 per 1,000 operations, but took the pool's reserved / live on `a` at 4 threads from
/// 3.28 to 6.57 (64) and 8.21 (16), which the memory target forbids.
pub(crate) const RECORD_RUN: u32 = 256;

/// The most blocks a list of equal blocks (the fixed-size resource's) hands a thief beside the
/// one it took, half its other blocks at most. Measured (H100): with 32, fixed-size's stream
/// waits at 16 threads fell from 53 to 4 per 1,000 operations; other values were not tried.
pub(crate) const THIEF_SHARE: usize = 32;
