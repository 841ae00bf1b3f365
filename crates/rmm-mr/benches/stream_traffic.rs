//! What crosses between streams when many streams share one sub-allocator: `threads` copies of
//! `gpu_alloc`'s traces, each on its own stream, replayed on the calling thread over a
//! do-nothing upstream and rmm-sys's simulated driver, with the driver calls and upstream
//! growths of the timed pass counted per operation (the run and what it found:
//! `docs/perf-log/2026-11-26-bins-16-threads.md`).
//!
//! ```text
//! stream_traffic [RESOURCE [TRACE [THREADS [SCHEDULE]]]]
//! ```
//!
//! - RESOURCE: `fixed_size` (block = the trace's largest size, 128 blocks per chunk), `binning`
//!   (fixed-size bins 256 KiB..4 MiB over a pool), `pool` (initial size 0), or `all` (default);
//! - TRACE: `a` (sizes 1 B-4 MiB, 1,000 live) or `b` (1 B-64 KiB, 2,000 live), 100,000
//!   operations each, `gpu_alloc`'s rules (`rmm_benches::Trace::random`), or `all`;
//! - THREADS: the number of copies, each on its own stream (default: 1, 4 and 16);
//! - SCHEDULE: `drift` (default: every step advances one copy drawn at random, so copies drift
//!   apart as threads do) or `step` (round robin: every copy in step).
//!
//! `--timed` runs the copies on real host threads instead, one per stream, started together
//! (as `gpu_alloc` does), and prints nanoseconds per operation of the timed pass as `gpu_alloc`
//! counts them (the slowest thread's wall time / (operations x threads)), the median of 5
//! passes after one warm-up pass on the same resource: a rough figure on a busy machine, for
//! comparing two builds side by side, not a benchmark.
//!
//! Every case builds a fresh resource, replays once untimed (the warm-up pass of `gpu_alloc`),
//! then once counted. Per operation it prints the event records, stream waits, device
//! synchronizations and events created (the driver calls a host thread pays for, each a
//! driver-wide lock on a real GPU), the upstream allocations (growth), and the reserved bytes;
//! for `fixed_size`, also the *slot-line handoffs*: the operations whose block shares a group
//! of four neighbouring blocks (one 64-byte line of packed 16-byte ledger slots) with a block
//! another stream wrote last, i.e. the cache-line transfers packed slots would cost (since
//! blocks of 4 KiB and more have a line of slots each, those transfers no longer happen for
//! them). No GPU and no timing: the counts are exact and the same on any machine.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rmm_mr::testing::Rng;
use rmm_mr::{
    BinningMemoryResource, BinningOptions, DeviceMemoryResource, FixedSizeMemoryResource,
    FixedSizeOptions, MrResult, PoolMemoryResource,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::fault::{calls, DriverCall, FaultScope};
use rmm_sys::DevicePtr;

const OPS: usize = 100_000;
const MIB: usize = 1 << 20;

/// A do-nothing upstream that counts its allocations and live bytes.
#[derive(Debug, Default)]
struct CountingUpstream {
    next: AtomicU64,
    allocations: AtomicUsize,
    live: AtomicUsize,
    peak: AtomicUsize,
}

// SAFETY: a benchmark double handing out fake addresses, never dereferenced.
unsafe impl DeviceMemoryResource for CountingUpstream {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(live, Ordering::Relaxed);
        let step = (bytes as u64).div_ceil(256) * 256;
        Ok(DevicePtr::from_raw(
            (1 << 40) + self.next.fetch_add(step, Ordering::Relaxed),
        ))
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        _ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        std::ptr::eq(
            self as *const Self as *const u8,
            other.as_any() as *const dyn std::any::Any as *const u8,
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[derive(Clone, Copy)]
enum Op {
    Alloc { slot: usize, size: usize },
    Free { slot: usize },
}

/// `gpu_alloc`'s traces (`rmm_benches::Trace::random`, same generator and seed): below `live`
/// allocate, above free a random live one, at it flip a coin; everything is freed at the end.
fn trace(max: usize, live: usize) -> (Vec<Op>, usize) {
    let mut rng = Rng::new(0x000b_e2c4);
    let (mut out, mut free, mut used, mut slots) = (Vec::new(), Vec::new(), Vec::new(), 0);
    while out.len() + used.len() < OPS {
        if used.len() < live || (used.len() == live && rng.next_u64() & 1 == 0) {
            let slot = free.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            out.push(Op::Alloc {
                slot,
                size: rng.range(1, max),
            });
            used.push(slot);
        } else {
            let i = rng.range(0, used.len() - 1);
            let slot = used.swap_remove(i);
            out.push(Op::Free { slot });
            free.push(slot);
        }
    }
    out.extend(used.into_iter().map(|slot| Op::Free { slot }));
    (out, slots)
}

fn build(name: &str, max: usize, up: &Arc<CountingUpstream>) -> Box<dyn DeviceMemoryResource> {
    let up = Arc::clone(up);
    match name {
        "pool" => Box::new(PoolMemoryResource::new(up, 0).unwrap()),
        "binning" => Box::new(
            BinningMemoryResource::with_options(
                PoolMemoryResource::new(up, 0).unwrap(),
                BinningOptions::new()
                    .min_size_exponent(18)
                    .max_size_exponent(22),
            )
            .unwrap(),
        ),
        "fixed_size" => Box::new(
            FixedSizeMemoryResource::with_options(
                up,
                FixedSizeOptions::new()
                    .block_size(max)
                    .blocks_to_preallocate(128),
            )
            .unwrap(),
        ),
        other => panic!("unknown resource {other}"),
    }
}

const KINDS: [(DriverCall, &str); 4] = [
    (DriverCall::EventRecord, "event records"),
    (DriverCall::StreamWait, "stream waits"),
    (DriverCall::Synchronize, "device syncs"),
    (DriverCall::EventCreate, "events created"),
];

fn counts() -> [u64; 4] {
    KINDS.map(|(k, _)| calls(k))
}

/// Replays the copies twice (warm-up, counted) and prints one table row.
fn run(resource: &str, which: &str, threads: usize, drift: bool) {
    let (max, live) = match which {
        "a" => (4 * MIB, 1000),
        "b" => (64 << 10, 2000),
        other => panic!("unknown trace {other}"),
    };
    let (ops, slots) = trace(max, live);
    let up = Arc::new(CountingUpstream::default());
    let mr = build(resource, max, &up);
    let streams: Vec<CudaStream> = (0..threads)
        .map(|t| CudaStream::simulated(100 + t as u32))
        .collect();
    let mut held = vec![vec![(DevicePtr::NULL, 0usize); slots]; threads];
    let mut rng = Rng::new(0x5eed ^ threads as u64);
    let mut before = ([0; 4], 0);
    // Fixed-size only: which stream last wrote each group of four block slots (one cache line
    // of the ledger), and how many counted operations wrote a line another stream wrote last.
    let mut last_writer: std::collections::HashMap<u64, usize> = Default::default();
    let mut handoffs = 0usize;
    let mut touch = |addr: DevicePtr, t: usize, counted: bool| {
        if resource != "fixed_size" || addr.is_null() {
            return;
        }
        let line = (addr.addr() - (1 << 40)) / (4 * max as u64);
        if last_writer.insert(line, t).is_some_and(|w| w != t) && counted {
            handoffs += 1;
        }
    };
    for pass in 0..2 {
        if pass == 1 {
            before = (counts(), up.allocations.load(Ordering::Relaxed));
        }
        let mut at = vec![0usize; threads];
        let mut running: Vec<usize> = (0..threads).collect();
        let mut turn = 0;
        while !running.is_empty() {
            let k = if drift {
                rng.range(0, running.len() - 1)
            } else {
                turn % running.len()
            };
            turn += 1;
            let t = running[k];
            let stream = streams[t].view();
            match ops[at[t]] {
                Op::Alloc { slot, size } => {
                    let p = mr.allocate(stream, size, 256).unwrap();
                    touch(p, t, pass == 1);
                    held[t][slot] = (p, size);
                }
                Op::Free { slot } => {
                    let (p, size) = std::mem::replace(&mut held[t][slot], (DevicePtr::NULL, 0));
                    touch(p, t, pass == 1);
                    // SAFETY: `p` came from `mr` with `size`, freed once.
                    unsafe { mr.deallocate(stream, p, size, 256).unwrap() };
                }
            }
            at[t] += 1;
            if at[t] == ops.len() {
                if drift {
                    running.swap_remove(k);
                } else {
                    running.remove(k);
                    turn = k;
                }
            }
        }
    }
    let after = counts();
    let total = (ops.len() * threads) as f64;
    let per = |i: usize| (after[i] - before.0[i]) as f64 / total;
    let growths = up.allocations.load(Ordering::Relaxed) - before.1;
    println!(
        "| {resource} | {which} | {threads} | {} | {:.4} | {:.4} | {:.5} | {:.5} | {growths} | {} | {} |",
        if drift { "drift" } else { "step" },
        per(0),
        per(1),
        per(2),
        per(3),
        up.peak.load(Ordering::Relaxed) / MIB,
        if resource == "fixed_size" {
            format!("{:.4}", handoffs as f64 / total)
        } else {
            "-".to_owned()
        },
    );
    drop(mr);
}

/// `--timed`: the copies on real threads (see the module documentation); ns per operation.
fn timed(resource: &str, which: &str, threads: usize) {
    let (max, live) = match which {
        "a" => (4 * MIB, 1000),
        "b" => (64 << 10, 2000),
        other => panic!("unknown trace {other}"),
    };
    let (ops, slots) = trace(max, live);
    let up = Arc::new(CountingUpstream::default());
    let mr = build(resource, max, &up);
    let streams: Vec<CudaStream> = (0..threads)
        .map(|t| CudaStream::simulated(100 + t as u32))
        .collect();
    let barrier = std::sync::Barrier::new(threads);
    let mut samples = Vec::new();
    for pass in 0..6 {
        let walls: Vec<std::time::Duration> = std::thread::scope(|s| {
            let joins: Vec<_> = streams
                .iter()
                .map(|stream| {
                    let (mr, ops, barrier) = (&*mr, &ops, &barrier);
                    s.spawn(move || {
                        let _sim = FaultScope::simulated();
                        let view = stream.view();
                        let mut held = vec![(DevicePtr::NULL, 0usize); slots];
                        barrier.wait();
                        let start = std::time::Instant::now();
                        for op in ops {
                            match *op {
                                Op::Alloc { slot, size } => {
                                    held[slot] = (mr.allocate(view, size, 256).unwrap(), size);
                                }
                                Op::Free { slot } => {
                                    let (p, size) =
                                        std::mem::replace(&mut held[slot], (DevicePtr::NULL, 0));
                                    // SAFETY: `p` came from `mr` with `size`, freed once.
                                    unsafe { mr.deallocate(view, p, size, 256).unwrap() };
                                }
                            }
                        }
                        start.elapsed()
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        if pass > 0 {
            let worst = walls.into_iter().max().unwrap_or_default();
            samples.push(worst.as_nanos() as f64 / (ops.len() * threads) as f64);
        }
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "| {resource} | {which} | {threads} | {:.1} |",
        samples[samples.len() / 2]
    );
    drop(mr);
}

fn main() {
    let timed_mode = std::env::args().any(|a| a == "--timed");
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let pick = |i: usize, all: &[&'static str]| -> Vec<String> {
        match args.get(i).map(String::as_str) {
            None | Some("all") => all.iter().map(|s| s.to_string()).collect(),
            Some(one) => vec![one.to_owned()],
        }
    };
    let resources = pick(0, &["fixed_size", "binning", "pool"]);
    let traces = pick(1, &["a", "b"]);
    let threads: Vec<usize> = pick(2, &["1", "4", "16"])
        .iter()
        .map(|t| t.parse().expect("THREADS is a number"))
        .collect();
    let schedules = pick(3, &["drift"]);
    let _sim = FaultScope::simulated();
    if timed_mode {
        println!("| resource | trace | threads | ns per operation (median of 5) |");
        println!("|---|---|---:|---:|");
        for r in &resources {
            for tr in &traces {
                for &t in &threads {
                    timed(r, tr, t);
                }
            }
        }
        return;
    }
    println!(
        "| resource | trace | streams | schedule | event records / op | stream waits / op | \
         device syncs / op | events created / op | upstream growths (timed pass) | peak reserved MiB | \
         slot-line handoffs / op |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &resources {
        for tr in &traces {
            for &t in &threads {
                for s in &schedules {
                    run(r, tr, t, s == "drift");
                }
            }
        }
    }
}
