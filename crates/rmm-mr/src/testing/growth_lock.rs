//! How long growers held a stream-ordered resource's growth lock (the pool, the fixed-size
//! resource, the VMM pool): each hold, from the lock's acquisition to its release (the search,
//! the waits for frees and merges to land, the upstream call), goes into a lock-free
//! record per resource, a maximum and a log-linear histogram. Only with the `testing` feature:
//! `gpu_alloc` prints it; a build without the feature records nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two: a quantile is read to within 1/8 of its value.
const SUB: usize = 8;
/// Values below `SUB` have a bucket each; then `SUB` buckets per power of two up to 2^64.
const BUCKETS: usize = SUB + (64 - 3) * SUB;

/// The bucket of `ns`.
fn bucket(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros() as usize; // >= 3
    let sub = ((ns >> (exp - 3)) & (SUB as u64 - 1)) as usize;
    (exp - 2) * SUB + sub
}

/// The largest value in bucket `i`.
fn bucket_top(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let exp = i / SUB + 2;
    let low = ((SUB + i % SUB) as u64) << (exp - 3);
    low + ((1u64 << (exp - 3)) - 1)
}

/// The live record of a resource's growth-lock holds (lock-free: growers record as they let
/// the lock go).
#[derive(Debug)]
pub(crate) struct HoldRecorder {
    counts: Box<[AtomicU64]>,
    max_ns: AtomicU64,
    max_beyond_ns: AtomicU64,
    max_yields: AtomicU64,
    ran_out: AtomicU64,
}

impl HoldRecorder {
    pub(crate) fn new() -> Self {
        Self {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_ns: AtomicU64::new(0),
            max_beyond_ns: AtomicU64::new(0),
            max_yields: AtomicU64::new(0),
            ran_out: AtomicU64::new(0),
        }
    }

    /// One hold of `held`, `upstream` of it in the upstream's allocation calls, whose grower
    /// yielded `yields` times waiting, and whose wait budget ran out or not.
    pub(crate) fn record(&self, held: Duration, upstream: Duration, yields: u32, ran_out: bool) {
        let ns = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX);
        let beyond = u64::try_from(held.saturating_sub(upstream).as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
        self.max_beyond_ns.fetch_max(beyond, Ordering::Relaxed);
        self.max_yields
            .fetch_max(u64::from(yields), Ordering::Relaxed);
        if ran_out {
            self.ran_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What was recorded so far.
    pub(crate) fn snapshot(&self) -> GrowthLockHolds {
        GrowthLockHolds {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            max_ns: self.max_ns.load(Ordering::Relaxed),
            max_beyond_ns: self.max_beyond_ns.load(Ordering::Relaxed),
            max_yields: self.max_yields.load(Ordering::Relaxed),
            ran_out: self.ran_out.load(Ordering::Relaxed),
        }
    }
}

/// How long growers held a resource's growth lock: the number of holds, their quantiles (read
/// from a log-linear histogram, to within 1/8 of the value, never above the maximum), the
/// longest exactly, the most yields a grower made in one hold waiting for frees and merges to
/// land, and how many holds ended their wait because its budget ran out (see
/// `docs/internals/stream-ordered.md`, "The grower's patience").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowthLockHolds {
    counts: Vec<u64>,
    max_ns: u64,
    max_beyond_ns: u64,
    max_yields: u64,
    ran_out: u64,
}

impl Default for GrowthLockHolds {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            max_ns: 0,
            max_beyond_ns: 0,
            max_yields: 0,
            ran_out: 0,
        }
    }
}

impl GrowthLockHolds {
    /// The most yields a grower makes waiting in one hold (the budget's steps, of which each
    /// search again takes one too).
    pub const BUDGET_YIELDS: u32 = crate::stream_ordered::tuning::PATIENCE;

    /// The most wall time a grower spends waiting in one hold, counted from the lock's
    /// acquisition (the budget's time).
    pub const BUDGET_TIME: Duration = crate::stream_ordered::tuning::WAIT_TIME;

    /// Holds recorded.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The longest hold.
    #[must_use]
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// The longest hold less the time its grower spent in the upstream's allocation calls:
    /// what the resource itself kept the lock for (its searches and waits). The arena's
    /// global lock calls no upstream, so there it is [`max`](Self::max).
    #[must_use]
    pub fn max_beyond_upstream(&self) -> Duration {
        Duration::from_nanos(self.max_beyond_ns)
    }

    /// The hold time at quantile `q` (0.5: the median; 0.999: p99.9), rounded up to its
    /// histogram bucket's top and never above [`max`](Self::max); zero when nothing was
    /// recorded.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Duration {
        let n = self.count();
        if n == 0 {
            return Duration::ZERO;
        }
        // The rank of the quantile, 1-based: the smallest value with at least `q * n` values at
        // or below it.
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(bucket_top(i).min(self.max_ns));
            }
        }
        self.max()
    }

    /// The most yields one grower made in one hold.
    #[must_use]
    pub fn max_yields(&self) -> u64 {
        self.max_yields
    }

    /// Holds whose wait stopped because the growth's budget ran out.
    #[must_use]
    pub fn budget_ran_out(&self) -> u64 {
        self.ran_out
    }

    /// The holds recorded after `earlier`, a snapshot of the same record (a pass of a run):
    /// counts and the yields' budget are subtracted; the longest hold and the most yields stay
    /// those of the whole record.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            max_ns: self.max_ns,
            max_beyond_ns: self.max_beyond_ns,
            max_yields: self.max_yields,
            ran_out: self.ran_out.saturating_sub(earlier.ran_out),
        }
    }

    /// The holds of `self` and of `other` together (several resources or runs).
    #[must_use]
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            counts: self
                .counts
                .iter()
                .zip(&other.counts)
                .map(|(a, b)| a + b)
                .collect(),
            max_ns: self.max_ns.max(other.max_ns),
            max_beyond_ns: self.max_beyond_ns.max(other.max_beyond_ns),
            max_yields: self.max_yields.max(other.max_yields),
            ran_out: self.ran_out + other.ran_out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        for ns in (0..10_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let i = bucket(ns);
            assert!(i < BUCKETS, "{ns}");
            assert!(ns <= bucket_top(i), "{ns} above its bucket's top");
            if i > 0 {
                assert!(ns > bucket_top(i - 1), "{ns} at or below the previous top");
            }
            // Within 1/8 of the value.
            assert!(bucket_top(i) - ns <= ns / 8, "{ns}");
        }
        assert_eq!(bucket_top(BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn quantiles_max_and_sums() {
        let r = HoldRecorder::new();
        assert_eq!(r.snapshot().quantile(0.5), Duration::ZERO);
        for us in 1..=1000u64 {
            r.record(Duration::from_micros(us), Duration::ZERO, 0, false);
        }
        r.record(
            Duration::from_millis(40),
            Duration::from_millis(39),
            1024,
            true,
        );
        let s = r.snapshot();
        assert_eq!(s.count(), 1001);
        assert_eq!(s.max(), Duration::from_millis(40));
        assert_eq!((s.max_yields(), s.budget_ran_out()), (1024, 1));
        // The 40 ms hold spent 39 of them upstream: the longest hold beyond the upstream is the
        // 1 ms hold that called none.
        assert_eq!(s.max_beyond_upstream(), Duration::from_millis(1));
        let p50 = s.quantile(0.5).as_nanos();
        assert!((500_000..=500_000 + 500_000 / 8).contains(&p50), "{p50}");
        let p999 = s.quantile(0.999).as_nanos();
        assert!(
            (1_000_000..=1_000_000 + 1_000_000 / 8).contains(&p999),
            "{p999}"
        );
        assert_eq!(s.quantile(1.0), s.max());
        let both = s.plus(&s);
        assert_eq!(
            (both.count(), both.max(), both.budget_ran_out()),
            (2002, s.max(), 2)
        );
        assert_eq!(GrowthLockHolds::default().plus(&s), s);
    }
}
