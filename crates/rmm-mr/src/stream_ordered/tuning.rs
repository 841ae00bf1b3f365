//! The stream-ordered core's tuning constants, all of them, each with what chose it. The
//! figures and how they were measured: `docs/internals/stream-ordered.md`, "Tuning".

use std::time::Duration;

/// Frees that record an event after a thief took from a list or asked it to record (the
/// recording run). Carried over: 64 or 16 cut the event records at 16 threads from 120-196 to
/// 38-57 per 1,000 operations but raised the pool's reserved/live on trace `a` at 4 threads
/// from 3.28 to 6.57 and 8.21, which the memory target forbids.
pub(crate) const RECORD_RUN: u32 = 256;

/// How long a thief's request may wait for the owner to record before a thief synchronizes
/// the device instead. Carried over (not measured against other values): long against one
/// operation (tens to hundreds of ns), short against a kernel an idle owner may be waiting on.
pub(crate) const OWNER_GRACE: Duration = Duration::from_millis(2);

/// At most this many blocks a list of equal blocks hands a thief along with the one it stole
/// (half of its others, at most this). Carried over: with it, fixed-size's stream waits at 16
/// threads on 20,000-op passes fell from 53 to 4 per 1,000 operations.
pub(crate) const THIEF_SHARE: usize = 32;

/// Entries of each thread's cache of (resource, stream) → list. Carried over: a binning
/// resource's bins (up to 16 resources with consecutive numbers) each find their list with one
/// probe; the stream lookup is the "stream lookup" step of `pair_count --steps`.
pub(crate) const CACHE_SLOTS: usize = 16;
