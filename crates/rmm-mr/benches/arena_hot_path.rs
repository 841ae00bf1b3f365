//! Cost per operation of the arena allocator on the CPU, replaying the GPU benchmark's random
//! traces (`benches/src/lib.rs`: 100 000 operations, ~1 000 or ~2 000 live allocations):
//!
//! * `core`: the pure bookkeeping, driven as RMM drives it ([`LocalArena::allocate`] with the
//!   global arena, large frees to [`GlobalArena::deallocate`], small ones to the local arena);
//! * `resource`: [`ArenaMemoryResource`] over an upstream that hands out a fake address and
//!   makes no call, on the legacy default stream (one thread) or on each thread's per-thread
//!   default stream (several threads, one arena each), neither of which makes a CUDA call.
//!
//! Every criterion iteration is one operation of the trace: the replay goes on from where the
//! previous sample stopped (wrapping around: the trace ends with everything freed), so the
//! reported time is nanoseconds per operation in steady state. With several threads each one
//! replays its own copy on its own worker (kept for the whole benchmark, as a program keeps its
//! threads and streams) and the time is wall / (operations x threads).
//!
//! `ARENA_PROBE=<part of a case name> cargo bench -p rmm-mr --features testing --bench
//! arena_hot_path` skips criterion and prints the best and median of a few full replays of the
//! matching cases (quick, and handy under `valgrind --tool=cachegrind`).

use std::hint::black_box;
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::Criterion;
use rmm_mr::__internals::arena::{align_up, GlobalArena, LocalArena};
use rmm_mr::testing::{NullResource, Rng};
use rmm_mr::{ArenaMemoryResource, ArenaOptions, DeviceMemoryResource};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Like the GPU run's default arena (half of an H200's free memory).
const ARENA_SIZE: usize = 64 << 30;
const BASE: u64 = 1 << 40;
const OPS: usize = 100_000;
const SEED: u64 = 0xbe_2c4;

#[derive(Clone, Copy)]
enum Op {
    Alloc { slot: u32, size: usize },
    Free { slot: u32 },
}

/// The GPU benchmark's trace generator ([`Rng`]; below `live` outstanding it allocates,
/// above it frees, at `live` it flips a coin; the last operations free what is left).
fn trace(ops: usize, max_size: usize, live: usize) -> (Vec<Op>, usize) {
    let mut rng = Rng::new(SEED);
    let mut out = Vec::with_capacity(ops);
    let (mut free_slots, mut used): (Vec<u32>, Vec<u32>) = (vec![], vec![]);
    let mut slots = 0u32;
    while out.len() + used.len() < ops {
        if used.len() < live || (used.len() == live && rng.next_u64() & 1 == 0) {
            let slot = free_slots.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            let size = rng.range(1, max_size);
            out.push(Op::Alloc { slot, size });
            used.push(slot);
        } else {
            let i = rng.below(used.len());
            let slot = used.swap_remove(i);
            out.push(Op::Free { slot });
            free_slots.push(slot);
        }
    }
    out.extend(used.into_iter().map(|slot| Op::Free { slot }));
    (out, slots as usize)
}

/// Something that allocates and frees (addresses as `u64`).
trait Replayer: Send {
    fn alloc(&mut self, size: usize) -> u64;
    fn free(&mut self, addr: u64, size: usize);
}

/// A replay position in a trace, kept across samples.
struct Cursor<R> {
    ops: Arc<Vec<Op>>,
    held: Vec<(u64, usize)>,
    at: usize,
    target: R,
}

impl<R: Replayer> Cursor<R> {
    fn new(ops: Arc<Vec<Op>>, slots: usize, target: R) -> Self {
        Self {
            ops,
            held: vec![(0, 0); slots],
            at: 0,
            target,
        }
    }

    fn run(&mut self, n: u64) {
        for _ in 0..n {
            match self.ops[self.at] {
                Op::Alloc { slot, size } => {
                    self.held[slot as usize] = (black_box(self.target.alloc(size)), size);
                }
                Op::Free { slot } => {
                    let (addr, size) = self.held[slot as usize];
                    self.target.free(addr, size);
                }
            }
            self.at = (self.at + 1) % self.ops.len();
        }
    }
}

/// The core, driven as RMM's resource drives it (one local arena).
struct Core {
    global: GlobalArena,
    local: LocalArena,
}

impl Replayer for Core {
    fn alloc(&mut self, size: usize) -> u64 {
        self.local
            .allocate(size, &mut self.global)
            .unwrap_or_else(|| panic!("core: no room for {size} B"))
    }

    fn free(&mut self, addr: u64, size: usize) {
        let large = align_up(size).is_some_and(GlobalArena::handles);
        // A large block can sit in a partially used superblock lent whole to the local arena.
        let in_global = large && self.global.deallocate(addr, size) == Ok(true);
        if !in_global {
            let done = self.local.deallocate(addr, size);
            assert_eq!(done, Ok(true), "core: free of {addr:#x} ({size} B)");
        }
    }
}

/// The resource on one stream.
struct Resource {
    mr: ArenaMemoryResource<NullResource>,
    per_thread: bool,
}

impl Resource {
    fn stream(&self) -> CudaStreamView<'static> {
        if self.per_thread {
            CudaStreamView::per_thread()
        } else {
            CudaStreamView::legacy()
        }
    }
}

impl Replayer for Resource {
    fn alloc(&mut self, size: usize) -> u64 {
        self.mr
            .allocate(self.stream(), size, 256)
            .unwrap_or_else(|e| panic!("resource: {e}"))
            .addr()
    }

    fn free(&mut self, addr: u64, size: usize) {
        // SAFETY: `addr` came from this resource with `size` and is freed once; nothing uses
        // the (fake) memory.
        unsafe {
            self.mr
                .deallocate(self.stream(), DevicePtr::from_raw(addr), size, 256)
                .unwrap_or_else(|e| panic!("resource: {e}"));
        }
    }
}

/// Replayers on worker threads that live as long as the benchmark.
struct Workers {
    orders: Vec<mpsc::Sender<u64>>,
    start: Arc<Barrier>,
    done: Arc<Barrier>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    fn new<R: Replayer + 'static>(cursors: Vec<Cursor<R>>) -> Self {
        let n = cursors.len();
        let start = Arc::new(Barrier::new(n + 1));
        let done = Arc::new(Barrier::new(n + 1));
        let mut orders = vec![];
        let mut handles = vec![];
        for mut cursor in cursors {
            let (tx, rx) = mpsc::channel::<u64>();
            let (start, done) = (Arc::clone(&start), Arc::clone(&done));
            orders.push(tx);
            handles.push(std::thread::spawn(move || {
                while let Ok(n) = rx.recv() {
                    start.wait();
                    cursor.run(n);
                    done.wait();
                }
            }));
        }
        Self {
            orders,
            start,
            done,
            handles,
        }
    }

    /// Wall time for every worker to run `n` operations.
    fn run(&self, n: u64) -> Duration {
        for tx in &self.orders {
            tx.send(n).unwrap_or_else(|e| panic!("worker gone: {e}"));
        }
        self.start.wait();
        let t0 = Instant::now();
        self.done.wait();
        t0.elapsed()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.orders.clear();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

struct Spec {
    name: &'static str,
    max_size: usize,
    live: usize,
}

const SPECS: [Spec; 2] = [
    Spec {
        name: "a_1B-4MiB",
        max_size: 4 * MIB,
        live: 1000,
    },
    Spec {
        name: "b_1B-64KiB",
        max_size: 64 * KIB,
        live: 2000,
    },
];

fn core(c: &mut Criterion) {
    let mut group = c.benchmark_group("arena_core");
    for spec in &SPECS {
        let (ops, slots) = trace(OPS, spec.max_size, spec.live);
        let core = Core {
            global: GlobalArena::new(BASE, ARENA_SIZE).unwrap_or_else(|e| panic!("{e}")),
            local: LocalArena::new(),
        };
        let mut cursor = Cursor::new(Arc::new(ops), slots, core);
        group.bench_function(spec.name, |b| {
            b.iter_custom(|n| {
                let t0 = Instant::now();
                cursor.run(n);
                t0.elapsed()
            });
        });
        // Finish the trace so that the local arena can be cleaned without live blocks.
        let rest = (cursor.ops.len() - cursor.at) as u64;
        cursor.run(rest);
        let Core { global, local } = &mut cursor.target;
        let _ = local.clean(global);
    }
    group.finish();
}

fn resource(c: &mut Criterion) {
    let mut group = c.benchmark_group("arena_resource");
    for spec in &SPECS {
        let (ops, slots) = trace(OPS, spec.max_size, spec.live);
        let ops = Arc::new(ops);
        for threads in [1usize, 2] {
            let mr = ArenaMemoryResource::with_options(
                NullResource::new(),
                ArenaOptions::new().arena_size(ARENA_SIZE),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let cursors = (0..threads)
                .map(|_| {
                    let target = Resource {
                        mr: mr.clone(),
                        per_thread: threads > 1,
                    };
                    Cursor::new(Arc::clone(&ops), slots, target)
                })
                .collect();
            let workers = Workers::new(cursors);
            group.bench_function(format!("{}/{threads}_threads", spec.name), |b| {
                b.iter_custom(|n| workers.run(n) / threads as u32);
            });
        }
    }
    group.finish();
}

#[allow(missing_docs)] // criterion_group! generates an undocumented `pub fn benches`.
mod generated {
    use super::{core, resource, Criterion, Duration};
    criterion::criterion_group! {
        name = benches;
        config = Criterion::default()
            .sample_size(20)
            .warm_up_time(Duration::from_secs(2))
            .measurement_time(Duration::from_secs(4));
        targets = core, resource
    }
}

/// Quick look without criterion: a few full replays of each case whose name contains `filter`,
/// best and median nanoseconds per operation.
fn probe(filter: &str) {
    let report = |name: String, run: &mut dyn FnMut() -> Duration| {
        if !name.contains(filter) {
            return;
        }
        run();
        let mut samples: Vec<f64> = (0..7)
            .map(|_| run().as_nanos() as f64 / OPS as f64)
            .collect();
        samples.sort_by(f64::total_cmp);
        println!(
            "{name:<32} best {:>7.1} ns/op  median {:>7.1}",
            samples[0], samples[3]
        );
    };
    for spec in &SPECS {
        let (ops, slots) = trace(OPS, spec.max_size, spec.live);
        let ops = Arc::new(ops);
        let core = Core {
            global: GlobalArena::new(BASE, ARENA_SIZE).unwrap_or_else(|e| panic!("{e}")),
            local: LocalArena::new(),
        };
        let mut cursor = Cursor::new(Arc::clone(&ops), slots, core);
        report(format!("core/{}", spec.name), &mut || {
            let t0 = Instant::now();
            cursor.run(OPS as u64);
            t0.elapsed()
        });
        for threads in [1usize, 2] {
            let mr = ArenaMemoryResource::with_options(
                NullResource::new(),
                ArenaOptions::new().arena_size(ARENA_SIZE),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let cursors = (0..threads)
                .map(|_| {
                    let target = Resource {
                        mr: mr.clone(),
                        per_thread: threads > 1,
                    };
                    Cursor::new(Arc::clone(&ops), slots, target)
                })
                .collect();
            let workers = Workers::new(cursors);
            report(format!("resource/{}/{threads}", spec.name), &mut || {
                workers.run(OPS as u64) / threads as u32
            });
        }
    }
}

fn main() {
    if let Ok(filter) = std::env::var("ARENA_PROBE") {
        probe(&filter);
        return;
    }
    generated::benches();
    Criterion::default().configure_from_args().final_summary();
}
