//! Per-operation latency: one clock pair around each `allocate` and each `deallocate` call of
//! a replay, recorded into per-thread histograms ([`OpLatency`], `hdrhistogram`) that are
//! merged after the threads end, and the table of their percentiles (`gpu_alloc --latency`).
//!
//! Recording costs two clock readings (`Instant::now`, about 20-40 ns together on x86-64) and
//! one histogram increment per operation, which is the size of a sub-allocator's own
//! operation; so `gpu_alloc` records in a pass of its own, after the timed pass, and its ns/op
//! medians are those of a pass without clocks. The table says what an empty clock pair
//! measures on the machine ([`clock_pair_ns`]), which every figure includes.
//!
//! Only the public API that every version of `rmm-mr` since the benchmarks began has
//! (`DeviceMemoryResource::allocate` and `deallocate` on a stream), so the same source builds
//! against an older tree for before/after figures.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rmm_mr::{DeviceMemoryResource, MrError, MrResult};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::DevicePtr;

use crate::table::Table;
use crate::{Op, Trace};

/// The longest latency a histogram holds exactly (60 s in ns); longer ones are recorded as this.
const HIGHEST_NS: u64 = 60_000_000_000;
/// Significant decimal digits the histograms keep: a recorded value is within 0.1 % of the
/// latency (at 3 digits a histogram of 1 ns..60 s takes about 200 KiB).
const DIGITS: u8 = 3;

/// The percentiles the table shows, with their column names.
pub const PERCENTILES: [(f64, &str); 4] = [
    (0.5, "p50"),
    (0.99, "p99"),
    (0.999, "p99.9"),
    (0.9999, "p99.99"),
];

/// Latency histograms of one replay or more (in nanoseconds): allocations and frees apart.
#[derive(Debug, Clone)]
pub struct OpLatency {
    /// One value per `allocate` call.
    pub allocate: Histogram<u64>,
    /// One value per `deallocate` call.
    pub deallocate: Histogram<u64>,
}

fn histogram() -> MrResult<Histogram<u64>> {
    Histogram::new_with_bounds(1, HIGHEST_NS, DIGITS)
        .map_err(|e| MrError::bad_alloc(format!("latency histogram: {e:?}")))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl OpLatency {
    /// Empty histograms (1 ns to 60 s, three significant digits).
    pub fn new() -> MrResult<Self> {
        Ok(Self {
            allocate: histogram()?,
            deallocate: histogram()?,
        })
    }

    /// Records one `allocate` call that took `d` (longer than 60 s counts as 60 s).
    pub fn record_allocate(&mut self, d: Duration) {
        self.allocate.saturating_record(nanos(d));
    }

    /// Records one `deallocate` call that took `d`.
    pub fn record_deallocate(&mut self, d: Duration) {
        self.deallocate.saturating_record(nanos(d));
    }

    /// Adds `other`'s values (another thread's, another repetition's).
    pub fn merge(&mut self, other: &Self) -> MrResult<()> {
        let merge = |into: &mut Histogram<u64>, from: &Histogram<u64>| {
            into.add(from)
                .map_err(|e| MrError::bad_alloc(format!("merging latency histograms: {e:?}")))
        };
        merge(&mut self.allocate, &other.allocate)?;
        merge(&mut self.deallocate, &other.deallocate)
    }
}

/// `count, p50, p99, p99.9, p99.99, max` of `h` as table cells (ns; `-` when empty).
#[must_use]
pub fn cells(h: &Histogram<u64>) -> Vec<String> {
    let mut out = vec![h.len().to_string()];
    if h.is_empty() {
        out.extend(std::iter::repeat_n("-".to_owned(), PERCENTILES.len() + 1));
        return out;
    }
    out.extend(
        PERCENTILES
            .iter()
            .map(|&(q, _)| h.value_at_quantile(q).to_string()),
    );
    out.push(h.max().to_string());
    out
}

/// The latency table: one row per operation (`allocate`, `deallocate`) of each
/// `(threads, resource, latency)`, in the order given.
#[must_use]
pub fn table<'a>(rows: impl IntoIterator<Item = (usize, &'a str, &'a OpLatency)>) -> Table {
    let mut headers = vec!["threads", "resource", "operation", "count"];
    headers.extend(PERCENTILES.iter().map(|&(_, name)| name));
    headers.push("max");
    let mut t = Table::new(&headers, 0).text_columns(&[1, 2]);
    for (threads, resource, lat) in rows {
        for (op, h) in [("allocate", &lat.allocate), ("deallocate", &lat.deallocate)] {
            let mut row = vec![threads.to_string(), resource.to_owned(), op.to_owned()];
            row.extend(cells(h));
            t.row(row);
        }
    }
    t
}

/// The median cost of an empty clock pair (two `Instant::now` calls back to back) over `n`
/// pairs, in ns: what every recorded latency includes besides the call.
#[must_use]
pub fn clock_pair_ns(n: usize) -> f64 {
    let mut samples: Vec<f64> = (0..n.max(1))
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as f64
        })
        .collect();
    crate::median(&mut samples)
}

/// Replays `trace` through `mr` on `stream` as [`crate::replay`] does (alignment 256, the
/// stream synchronized at the end, what it holds given back on a failure), timing each
/// `allocate` and `deallocate` call into `lat`; returns the wall time of the whole replay.
pub fn replay_latency(
    mr: &dyn DeviceMemoryResource,
    stream: CudaStreamView<'_>,
    trace: &Trace,
    lat: &mut OpLatency,
) -> MrResult<Duration> {
    let mut held = vec![(DevicePtr::NULL, 0usize); trace.slots];
    let start = Instant::now();
    for (i, op) in trace.ops.iter().enumerate() {
        let step = match *op {
            Op::Alloc { slot, size } => {
                let t = Instant::now();
                let r = mr.allocate(stream, size, 256);
                lat.record_allocate(t.elapsed());
                r.map(|p| held[slot as usize] = (p, size))
            }
            Op::Free { slot } => {
                let (p, size) = std::mem::replace(&mut held[slot as usize], (DevicePtr::NULL, 0));
                let t = Instant::now();
                // SAFETY: `p` came from `mr` with `size` on this stream, freed once (the slot
                // is emptied above).
                let r = unsafe { mr.deallocate(stream, p, size, 256) };
                lat.record_deallocate(t.elapsed());
                r
            }
        };
        if let Err(e) = step {
            for (p, size) in held.into_iter().filter(|(p, _)| !p.is_null()) {
                // SAFETY: each live slot holds a pointer from `mr` with its size, freed once.
                let _ = unsafe { mr.deallocate(stream, p, size, 256) };
            }
            let _ = stream.synchronize();
            return Err(MrError::bad_alloc(format!(
                "operation {i} of {} ({op:?}) failed: {e}",
                trace.ops.len()
            )));
        }
    }
    stream.synchronize()?;
    Ok(start.elapsed())
}

/// [`crate::replay_threads`] with [`replay_latency`]: a copy of `trace` on each of
/// `streams.len()` threads, started together, each recording into its own histograms
/// (allocated before the start), merged after the threads end. Returns the slowest thread's
/// wall time and the merged histograms.
pub fn replay_threads_latency(
    mr: &dyn DeviceMemoryResource,
    trace: &Trace,
    streams: &[CudaStream],
) -> MrResult<(Duration, OpLatency)> {
    let device = rmm_sys::current_device()?;
    let barrier = std::sync::Barrier::new(streams.len() + 1);
    let mut own: Vec<OpLatency> = (0..streams.len())
        .map(|_| OpLatency::new())
        .collect::<MrResult<_>>()?;
    let results: Vec<MrResult<Duration>> = std::thread::scope(|s| {
        let joins: Vec<_> = streams
            .iter()
            .zip(own.iter_mut())
            .map(|(stream, lat)| {
                let barrier = &barrier;
                s.spawn(move || -> MrResult<Duration> {
                    let set = rmm_sys::set_current_device(device);
                    // Every thread reaches the barrier, whatever happened, or the others wait.
                    barrier.wait();
                    set?;
                    replay_latency(mr, stream.view(), trace, lat)
                })
            })
            .collect();
        barrier.wait();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(MrError::bad_alloc("thread panicked")))
            })
            .collect()
    });
    let mut worst = Duration::ZERO;
    for r in results {
        worst = worst.max(r?);
    }
    let mut all = OpLatency::new()?;
    for lat in &own {
        all.merge(lat)?;
    }
    Ok((worst, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(v: u64) -> Duration {
        Duration::from_nanos(v)
    }

    #[test]
    fn percentiles_of_known_values() {
        let mut lat = OpLatency::new().unwrap();
        // 10,000 allocations: 1..=10,000 ns; frees: 9,990 of 50 ns and 10 of 1 ms.
        for v in 1..=10_000 {
            lat.record_allocate(ns(v));
        }
        for _ in 0..9_990 {
            lat.record_deallocate(ns(50));
        }
        for _ in 0..10 {
            lat.record_deallocate(Duration::from_millis(1));
        }
        let a = cells(&lat.allocate);
        assert_eq!(a[0], "10000");
        // Three significant digits: each figure within 0.1 % of the exact one.
        let close = |cell: &str, exact: u64| {
            let v: f64 = cell.parse().unwrap();
            assert!(
                (v - exact as f64).abs() <= exact as f64 * 0.001 + 1.0,
                "{cell} against {exact}"
            );
        };
        close(&a[1], 5_000);
        close(&a[2], 9_900);
        close(&a[3], 9_990);
        close(&a[4], 9_999);
        close(&a[5], 10_000);
        let d = cells(&lat.deallocate);
        // The 10 slow frees are the top 0.1 %: p99.9 is still 50 ns, p99.99 and max 1 ms.
        assert_eq!(&d[..4], ["10000", "50", "50", "50"]);
        close(&d[4], 1_000_000);
        close(&d[5], 1_000_000);
    }

    #[test]
    fn merged_threads_count_every_operation() {
        let mut a = OpLatency::new().unwrap();
        let mut b = OpLatency::new().unwrap();
        for _ in 0..3 {
            a.record_allocate(ns(100));
        }
        b.record_allocate(ns(7_000));
        b.record_deallocate(ns(20));
        a.merge(&b).unwrap();
        assert_eq!((a.allocate.len(), a.deallocate.len()), (4, 1));
        assert_eq!(a.allocate.max(), b.allocate.max());
        assert_eq!(a.allocate.value_at_quantile(0.5), 100);
        // b is unchanged.
        assert_eq!(b.allocate.len(), 1);
    }

    #[test]
    fn zero_and_huge_latencies_are_recorded_not_refused() {
        let mut lat = OpLatency::new().unwrap();
        lat.record_allocate(Duration::ZERO);
        lat.record_allocate(Duration::from_secs(3600));
        assert_eq!(lat.allocate.len(), 2);
        assert_eq!(lat.allocate.min(), 0);
        // Clamped to the histogram's 60 s (within its precision).
        let max = lat.allocate.max();
        assert!(
            (HIGHEST_NS - HIGHEST_NS / 1000..=HIGHEST_NS + HIGHEST_NS / 1000).contains(&max),
            "{max}"
        );
    }

    #[test]
    fn the_table_has_a_row_per_operation_and_dashes_when_empty() {
        let mut lat = OpLatency::new().unwrap();
        lat.record_allocate(ns(42));
        let empty = OpLatency::new().unwrap();
        let text = table([(1, "pool", &lat), (16, "arena", &empty)]).render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "| threads | resource | operation | count | p50 | p99 | p99.9 | p99.99 | max |"
        );
        assert_eq!(lines[1], "|---:|---|---|---:|---:|---:|---:|---:|---:|");
        assert_eq!(
            lines[2],
            "| 1 | pool | allocate | 1 | 42 | 42 | 42 | 42 | 42 |"
        );
        assert_eq!(
            lines[3],
            "| 1 | pool | deallocate | 0 | - | - | - | - | - |"
        );
        assert_eq!(lines.len(), 6);
        assert_eq!(
            lines[5],
            "| 16 | arena | deallocate | 0 | - | - | - | - | - |"
        );
    }

    #[test]
    fn an_empty_clock_pair_costs_something_finite() {
        let c = clock_pair_ns(1000);
        assert!((0.0..1e6).contains(&c), "{c}");
    }

    /// The replay over simulated memory on a fake stream (no GPU): one value per call, the
    /// same number of allocations and frees as the trace, and a failure gives back what the
    /// replay held.
    #[cfg(feature = "driver-hooks")]
    #[test]
    fn replay_records_one_value_per_call() {
        use rmm_mr::{PoolMemoryResource, SimulatedMemoryResource};
        let _sim = rmm_sys::fault::FaultScope::simulated();
        let memory = SimulatedMemoryResource::new(1 << 30).unwrap();
        let pool = PoolMemoryResource::new(memory.clone(), 0).unwrap();
        let stream = CudaStream::simulated(1);
        let trace = Trace::random(2_000, 1, 64 << 10, 50, 3);
        let mut lat = OpLatency::new().unwrap();
        replay_latency(&pool, stream.view(), &trace, &mut lat).unwrap();
        let allocs = trace.allocations() as u64;
        assert_eq!(lat.allocate.len(), allocs);
        assert_eq!(lat.deallocate.len(), trace.ops.len() as u64 - allocs);

        // Too little memory: the replay fails, names the operation and holds nothing after.
        let small = SimulatedMemoryResource::new(256 << 10).unwrap();
        let mut lat = OpLatency::new().unwrap();
        let err = replay_latency(&small, stream.view(), &trace, &mut lat).unwrap_err();
        assert!(err.to_string().contains("operation "), "{err}");
        assert_eq!(small.used(), 0);
    }
}
