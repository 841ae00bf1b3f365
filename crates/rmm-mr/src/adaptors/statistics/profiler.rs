//! Profiling by region (RMM Python's `rmm.statistics.profiler`), on the statistics adaptor's
//! push/pop frames.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use crate::adaptors::statistics::StatisticsResourceAdaptor;
use crate::error::MrResult;
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::sync::Mutex;

/// What a [`MemoryProfiler`] recorded for one named region, over every time it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RegionRecord {
    /// How many times the region ran (RMM's `num_calls`).
    pub calls: u64,
    /// The highest peak of bytes allocated within one run, above what was allocated when it
    /// began (RMM's `memory_peak`).
    pub peak_bytes: i64,
    /// The bytes allocated within the runs, summed (RMM's `memory_total`).
    pub total_bytes: i64,
    /// The allocations made within the runs, summed.
    pub allocations: i64,
}

/// Profiles memory by named region (RMM Python's `rmm.statistics.profiler` and
/// `ProfilerRecords`): each region pushes a frame of the statistics adaptor's counters when it
/// begins and pops it when it ends, and the popped frame's peak and total go to the region's
/// record. Regions nest (an inner region's memory counts in the outer one too), in stack
/// order: a guard must be dropped before the guards made before it (scopes do that).
///
/// ```
/// use rmm_mr::testing::HostMockResource;
/// use rmm_mr::{DeviceMemoryResource, MemoryProfiler, StatisticsResourceAdaptor};
/// use rmm_stream::CudaStreamView;
///
/// let mr = StatisticsResourceAdaptor::new(HostMockResource::new());
/// let profiler = MemoryProfiler::new(mr.clone());
/// let s = CudaStreamView::legacy();
/// for _ in 0..2 {
///     let _step = profiler.region("train step");
///     let p = mr.allocate(s, 4096, 256).unwrap();
///     profiler.profile("inner", || {
///         let q = mr.allocate(s, 1024, 256).unwrap();
///         unsafe { mr.deallocate(s, q, 1024, 256) }.unwrap();
///     });
///     unsafe { mr.deallocate(s, p, 4096, 256) }.unwrap();
/// }
/// let step = profiler.record("train step").unwrap();
/// assert_eq!((step.calls, step.peak_bytes, step.total_bytes), (2, 5120, 10240));
/// println!("{}", profiler.report());
/// ```
#[doc(alias = "rmm.statistics.profiler")]
#[doc(alias = "rmm.statistics.ProfilerRecords")]
pub struct MemoryProfiler<U: DeviceMemoryResource = SharedResource> {
    stats: StatisticsResourceAdaptor<U>,
    records: Mutex<BTreeMap<String, RegionRecord>>,
}

/// A region of a [`MemoryProfiler`] being profiled: ends (and is recorded) when dropped.
#[must_use = "the region ends when the guard is dropped"]
pub struct RegionGuard<'a, U: DeviceMemoryResource> {
    profiler: &'a MemoryProfiler<U>,
    name: String,
}

impl<U: DeviceMemoryResource> Drop for RegionGuard<'_, U> {
    fn drop(&mut self) {
        if let Err(e) = self.profiler.end(&self.name) {
            log::error!(
                "rmm: memory profiler region {:?} ended out of order: {e}",
                self.name
            );
        }
    }
}

impl<U: DeviceMemoryResource> MemoryProfiler<U> {
    /// Profiles what goes through `stats` (allocate through it, or through a clone: clones
    /// share the counters).
    pub fn new(stats: StatisticsResourceAdaptor<U>) -> Self {
        Self {
            stats,
            records: Mutex::new(BTreeMap::new()),
        }
    }

    /// The statistics adaptor profiled.
    #[must_use]
    pub fn statistics(&self) -> &StatisticsResourceAdaptor<U> {
        &self.stats
    }

    /// Begins the region `name`; it ends when the guard is dropped.
    pub fn region(&self, name: impl Into<String>) -> RegionGuard<'_, U> {
        self.stats.push_counters();
        RegionGuard {
            profiler: self,
            name: name.into(),
        }
    }

    /// Runs `f` as the region `name` and returns what it returns.
    pub fn profile<R>(&self, name: impl Into<String>, f: impl FnOnce() -> R) -> R {
        let _region = self.region(name);
        f()
    }

    fn end(&self, name: &str) -> MrResult<()> {
        let (bytes, allocations) = self.stats.pop_counters()?;
        let mut records = self.records.lock();
        let r = records.entry(name.to_owned()).or_default();
        r.calls += 1;
        r.peak_bytes = r.peak_bytes.max(bytes.peak);
        r.total_bytes = r.total_bytes.wrapping_add(bytes.total);
        r.allocations = r.allocations.wrapping_add(allocations.total);
        Ok(())
    }

    /// The record of `name`, if it ran.
    #[must_use]
    pub fn record(&self, name: &str) -> Option<RegionRecord> {
        self.records.lock().get(name).copied()
    }

    /// Every record, by name.
    #[must_use]
    pub fn records(&self) -> Vec<(String, RegionRecord)> {
        self.records
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Forgets every record.
    pub fn clear(&self) {
        self.records.lock().clear();
    }

    /// The records as a table, highest peak first (RMM Python's `ProfilerRecords.report`,
    /// ordered by `memory_peak`): `ncalls`, `memory_peak`, `memory_total`, `allocations` and
    /// the region's name.
    #[must_use]
    pub fn report(&self) -> String {
        let mut rows = self.records();
        rows.sort_by(|a, b| b.1.peak_bytes.cmp(&a.1.peak_bytes).then(a.0.cmp(&b.0)));
        let mut out =
            String::from("Memory Profiling\n================\n\nOrdered by: memory_peak\n\n");
        let _ = writeln!(
            out,
            "{:>8} {:>14} {:>14} {:>12}  region",
            "ncalls", "memory_peak", "memory_total", "allocations"
        );
        for (name, r) in rows {
            let _ = writeln!(
                out,
                "{:>8} {:>14} {:>14} {:>12}  {name}",
                r.calls, r.peak_bytes, r.total_bytes, r.allocations
            );
        }
        out
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for MemoryProfiler<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryProfiler")
            .field("records", &*self.records.lock())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HostMockResource;
    use rmm_stream::CudaStreamView;

    #[test]
    fn regions_nest_and_accumulate() {
        let mr = StatisticsResourceAdaptor::new(HostMockResource::new());
        let p = MemoryProfiler::new(mr.clone());
        let s = CudaStreamView::legacy();
        let held = mr.allocate(s, 1 << 20, 256).unwrap();
        {
            let _outer = p.region("outer");
            let a = mr.allocate(s, 1000, 256).unwrap();
            for n in [512usize, 2048] {
                p.profile("inner", || {
                    let b = mr.allocate(s, n, 256).unwrap();
                    // SAFETY: allocated above, unused.
                    unsafe { mr.deallocate(s, b, n, 256) }.unwrap();
                });
            }
            // SAFETY: allocated above, unused.
            unsafe { mr.deallocate(s, a, 1000, 256) }.unwrap();
        }
        let inner = p.record("inner").unwrap();
        assert_eq!(
            (
                inner.calls,
                inner.peak_bytes,
                inner.total_bytes,
                inner.allocations
            ),
            (2, 2048, 2560, 2)
        );
        let outer = p.record("outer").unwrap();
        // Memory held before the region does not count.
        assert_eq!(
            (outer.calls, outer.peak_bytes, outer.total_bytes),
            (1, 3048, 3560)
        );
        let report = p.report();
        let lines: Vec<&str> = report.lines().collect();
        assert!(
            lines.iter().position(|l| l.ends_with("outer"))
                < lines.iter().position(|l| l.ends_with("inner")),
            "{report}"
        );
        assert!(report.contains("ncalls"), "{report}");
        assert_eq!(mr.depth(), 1);
        // SAFETY: allocated above, unused.
        unsafe { mr.deallocate(s, held, 1 << 20, 256) }.unwrap();
    }
}
