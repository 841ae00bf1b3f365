//! Allocate + free pairs of the sub-allocators over a do-nothing upstream, in a loop that is
//! easy to count instructions in (method: `docs/performance.md`, "Instructions per pair";
//! the runs: `docs/perf-log/`, e.g. `2026-11-27-pool-r64-host-time.md`).
//!
//! ```text
//! pair_count [--instructions [--steps]] [RESOURCE [SHAPE [MIX [STREAM [PAIRS]]]]]
//! ```
//!
//! - RESOURCE: `pool`, `vmm_pool`, `binning`, `fixed_size`, `arena`, `naive` (the GPU
//!   benchmarks' naive `Mutex<BTreeMap>` baseline, `rmm_mr::testing::naive`, over a fake
//!   region, for comparison) or `all` (default; every one but `naive`);
//! - SHAPE: `pair` (allocate, then free at once, with [`LIVE`] allocations of the mix held in
//!   the background) or `steady` ([`LIVE`] allocations live; each step frees a pseudo-randomly
//!   chosen one and allocates a new size in its place), or `all` (these two); or one of the
//!   peer comparison's traces `a`, `b`, `r1`, `r64` (`common::traces`: the operations the GPU
//!   peer run replays on an 80 GB device, 20,000 of them), replayed once uncounted and then
//!   PAIRS / 20,000 times (at least once) measured, MIX ignored, counted **per operation** (an
//!   allocation or a free), not per pair;
//! - MIX: `4MiB` (sizes uniform in 1 B-4 MiB) or `64KiB` (1 B-64 KiB), or `all`;
//! - STREAM: `legacy` (no CUDA call at all), `per_thread` (the calling thread's per-thread
//!   default stream), `stream` (an ordinary stream made from a raw handle, as a foreign stream
//!   is: rmm-sys's simulated driver answers its `cuStreamGetId` and events, so the path is a
//!   real stream's minus the driver's own time) or `owned` (a view of an rmm-stream
//!   `CudaStream` over the simulation, the GPU benchmark's path), or `all`;
//! - PAIRS: pairs in the measured loop (default 100,000; 20,000 with `--instructions`).
//!
//! Resources are configured as in the GPU benchmark: `pool` of initial size 0, `binning`
//! (fixed-size bins 256 KiB..4 MiB over such a pool), `fixed_size` (block = the mix's largest
//! size, 128 blocks per chunk), `arena` (64 GiB), `vmm_pool` (a simulated VMM pool of at most
//! 64 GiB with 2 MiB granularity: growth maps nothing, the hot path is the real one). Every
//! case first runs the loop once uncounted (lists and maps reach their steady size), then once
//! measured.
//!
//! Without a flag it prints nanoseconds per pair (a quick look on a quiet machine, not a
//! benchmark). `--instructions` runs each case in a child under
//! `valgrind --tool=callgrind --toggle-collect=*pair_count::measured*` and prints the
//! instructions of the measured loop divided by the pairs: exact and repeatable on any x86-64
//! machine. `--steps` also splits them by step (stream lookup, list lock, free list,
//! handed-out record, event policy, ...), from the source file and enclosing `fn` of every
//! instruction, inlined code included: build with line tables for it
//! (`CARGO_PROFILE_BENCH_DEBUG=line-tables-only`).

use std::collections::HashMap;
use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use rmm_mr::testing::naive::NaiveRegion;
use rmm_mr::testing::NullResource;
use rmm_mr::{
    ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions, DeviceMemoryResource,
    FixedSizeMemoryResource, FixedSizeOptions, PoolMemoryResource, VmmPoolMemoryResource,
    VmmPoolOptions,
};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

mod common;

use common::traces::{self, Op};
use common::{sequences, LIVE, SEQ};

fn build(name: &str, max: usize) -> Box<dyn DeviceMemoryResource> {
    match name {
        "pool" => Box::new(PoolMemoryResource::new(NullResource::new(), 0).unwrap()),
        "binning" => Box::new(
            BinningMemoryResource::with_options(
                PoolMemoryResource::new(NullResource::new(), 0).unwrap(),
                BinningOptions::new()
                    .min_size_exponent(18)
                    .max_size_exponent(22),
            )
            .unwrap(),
        ),
        "fixed_size" => Box::new(
            FixedSizeMemoryResource::with_options(
                NullResource::new(),
                FixedSizeOptions::new()
                    .block_size(max)
                    .blocks_to_preallocate(128),
            )
            .unwrap(),
        ),
        "arena" => Box::new(
            ArenaMemoryResource::with_options(
                NullResource::new(),
                ArenaOptions::new().arena_size(64 << 30),
            )
            .unwrap(),
        ),
        "vmm_pool" => {
            Box::new(VmmPoolMemoryResource::simulated(VmmPoolOptions::new(64 << 30)).unwrap())
        }
        // The history adaptor over the pool (not in `all`): its cost per pair is the
        // difference from `pool` (`HistoryResourceAdaptor`'s documentation).
        "pool_history" => Box::new(rmm_mr::HistoryResourceAdaptor::new(
            PoolMemoryResource::new(NullResource::new(), 0).unwrap(),
        )),
        "pool_history_bt" => Box::new(rmm_mr::HistoryResourceAdaptor::with_options(
            PoolMemoryResource::new(NullResource::new(), 0).unwrap(),
            rmm_mr::HistoryOptions::new().backtraces(true),
        )),
        // The GPU benchmarks' baseline (`rmm_benches::naive::NaiveBestFit` hands its region to
        // the same `NaiveRegion`) over a fake region.
        "naive" => Box::new(NaiveRegion::new(1 << 40, 64 << 30)),
        other => panic!("unknown resource {other}"),
    }
}

/// One case's state: the resource, its stream, the sequences and the allocations held.
struct Case {
    mr: Box<dyn DeviceMemoryResource>,
    stream: CudaStreamView<'static>,
    sizes: Vec<usize>,
    slots: Vec<usize>,
    live: Vec<(DevicePtr, usize)>,
    at: usize,
}

impl Case {
    fn new(resource: &str, max: usize, stream: CudaStreamView<'static>) -> Self {
        let mr = build(resource, max);
        let (sizes, slots) = sequences(max);
        let live = sizes[SEQ - LIVE..]
            .iter()
            .map(|&b| (mr.allocate(stream, b, 256).unwrap(), b))
            .collect();
        Self {
            mr,
            stream,
            sizes,
            slots,
            live,
            at: 0,
        }
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        for &(p, b) in &self.live {
            // SAFETY: each came from `mr` with `b` bytes and is freed once.
            unsafe { self.mr.deallocate(self.stream, p, b, 256).unwrap() };
        }
    }
}

/// The measured pass (callgrind counts this function's inclusive instructions; the untimed
/// first pass calls [`run_pairs`] directly, so it is not counted).
#[inline(never)]
fn measured(case: &mut Case, steady: bool, pairs: usize) {
    run_pairs(case, steady, pairs);
}

/// A peer trace's replay: the resource, its stream, the operations and what each slot holds.
struct TraceCase {
    mr: Box<dyn DeviceMemoryResource>,
    stream: CudaStreamView<'static>,
    ops: Vec<Op>,
    held: Vec<(DevicePtr, usize)>,
}

/// The measured replays (see [`measured`]).
#[inline(never)]
fn measured_trace(case: &mut TraceCase, reps: usize) {
    for _ in 0..reps {
        replay(case);
    }
}

/// One replay of the trace (every allocation is freed by its end).
#[inline(never)]
fn replay(case: &mut TraceCase) {
    let mr = &*case.mr;
    let stream = case.stream;
    for op in &case.ops {
        match *op {
            Op::Alloc { slot, size } => {
                let p = mr.allocate(stream, black_box(size), 256).unwrap();
                case.held[slot as usize] = (p, size);
            }
            Op::Free { slot } => {
                let (p, size) = case.held[slot as usize];
                // SAFETY: the slot holds an allocation of `mr` with its size; the trace frees
                // each allocation once.
                unsafe { mr.deallocate(stream, black_box(p), size, 256).unwrap() };
            }
        }
    }
}

/// `pairs` allocate + free pairs, `steady` or not (see the module documentation).
#[inline(never)]
fn run_pairs(case: &mut Case, steady: bool, pairs: usize) {
    let mr = &*case.mr;
    let stream = case.stream;
    for _ in 0..pairs {
        let i = case.at & (SEQ - 1);
        case.at += 1;
        let bytes = case.sizes[i];
        if steady {
            let slot = &mut case.live[case.slots[i]];
            // SAFETY: the slot's allocation came from `mr` with its size; freed once.
            unsafe {
                mr.deallocate(stream, black_box(slot.0), slot.1, 256)
                    .unwrap()
            };
            *slot = (mr.allocate(stream, black_box(bytes), 256).unwrap(), bytes);
        } else {
            let p = mr.allocate(stream, black_box(bytes), 256).unwrap();
            // SAFETY: `p` came from `mr` with `bytes`; freed once.
            unsafe { mr.deallocate(stream, black_box(p), bytes, 256).unwrap() };
        }
    }
}

fn pick<'a>(arg: Option<&'a str>, all: &[&'a str]) -> Vec<&'a str> {
    match arg {
        None | Some("all") => all.to_vec(),
        Some(one) => vec![one],
    }
}

/// One case, as named on the command line.
struct CaseName<'a> {
    resource: &'a str,
    shape: &'a str,
    mix: &'a str,
    stream: &'a str,
}

impl CaseName<'_> {
    fn max(&self) -> usize {
        match self.mix {
            "4MiB" => 4 << 20,
            "64KiB" => 64 << 10,
            other => panic!("unknown mix {other}"),
        }
    }

    /// The peer trace this case replays, if its shape names one.
    fn trace(&self) -> Option<&str> {
        traces::NAMES.contains(&self.shape).then_some(self.shape)
    }

    fn steady(&self) -> bool {
        match self.shape {
            "pair" => false,
            "steady" => true,
            other => panic!("unknown shape {other}"),
        }
    }

    fn stream(&self) -> CudaStreamView<'static> {
        match self.stream {
            "legacy" => CudaStreamView::legacy(),
            "per_thread" => CudaStreamView::per_thread(),
            "stream" => CudaStreamView::simulated(1),
            "owned" => {
                static OWNED: std::sync::OnceLock<rmm_stream::CudaStream> =
                    std::sync::OnceLock::new();
                OWNED
                    .get_or_init(|| rmm_stream::CudaStream::simulated(2))
                    .view()
            }
            other => panic!("unknown stream {other}"),
        }
    }

    /// Runs the case once uncounted and once measured; nanoseconds per pair (per operation
    /// for a trace).
    fn run(&self, pairs: usize) -> f64 {
        if let Some(name) = self.trace() {
            let (ops, slots) = traces::peer(name);
            let mut case = TraceCase {
                mr: build(self.resource, 64 << 20),
                stream: self.stream(),
                held: vec![(DevicePtr::NULL, 0); slots],
                ops,
            };
            replay(&mut case);
            let grown = NullResource::allocations_in_process();
            let reps = pairs.div_ceil(case.ops.len()).max(1);
            let t = Instant::now();
            measured_trace(&mut case, reps);
            let ns = t.elapsed().as_nanos() as f64 / (reps * case.ops.len()) as f64;
            let grew = NullResource::allocations_in_process() - grown;
            if grew > 0 {
                eprintln!("pair_count: the measured replay called the upstream {grew} times");
            }
            return ns;
        }
        let mut case = Case::new(self.resource, self.max(), self.stream());
        run_pairs(&mut case, self.steady(), pairs);
        let t = Instant::now();
        measured(&mut case, self.steady(), pairs);
        t.elapsed().as_nanos() as f64 / pairs.max(1) as f64
    }

    /// Runs the case in a child under callgrind; the measured loop's instructions per pair,
    /// and with `steps` their split by step.
    fn count(&self, pairs: usize, steps: bool) -> (u64, Vec<(&'static str, u64)>) {
        let out = std::env::temp_dir().join(format!(
            "pair_count.{}.{}.{}.{}.{}.callgrind",
            std::process::id(),
            self.resource,
            self.shape,
            self.mix,
            self.stream
        ));
        let me = std::env::current_exe().expect("the benchmark's own path");
        let child = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg("--toggle-collect=*pair_count::measured*")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(me)
            .args([self.resource, self.shape, self.mix, self.stream])
            .arg(pairs.to_string())
            .output()
            .expect("valgrind could not be started (is it installed?)");
        let log = String::from_utf8_lossy(&child.stderr);
        assert!(child.status.success(), "callgrind failed:\n{log}");
        let per = match self.trace() {
            Some(name) => {
                let ops = traces::peer(name).0.len();
                pairs.div_ceil(ops).max(1) * ops
            }
            None => pairs,
        };
        let collected: u64 = log
            .lines()
            .find_map(|l| l.split("Collected :").nth(1))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no instruction count in:\n{log}"));
        let split = if steps {
            let text = std::fs::read_to_string(&out).expect("callgrind's output");
            let mut by_step = steps::split(&text);
            for (_, ir) in &mut by_step {
                *ir /= per as u64;
            }
            by_step
        } else {
            Vec::new()
        };
        let _ = std::fs::remove_file(&out);
        (collected / per as u64, split)
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut flag = |name: &str| {
        let found = args.iter().any(|a| a == name);
        args.retain(|a| a != name);
        found
    };
    let instructions = flag("--instructions");
    let steps = flag("--steps");
    let arg = |i: usize| args.get(i).map(String::as_str);
    let resources = pick(
        arg(0),
        &["pool", "vmm_pool", "binning", "fixed_size", "arena"],
    );
    let shapes = pick(arg(1), &["pair", "steady"]);
    let mut mixes = pick(arg(2), &["4MiB", "64KiB"]);
    if shapes.iter().all(|s| traces::NAMES.contains(s)) {
        // A trace has its own sizes.
        mixes.truncate(1);
    }
    let streams = pick(arg(3), &["legacy", "per_thread", "stream", "owned"]);
    let default_pairs = if instructions { 20_000 } else { 100_000 };
    let pairs: usize = arg(4).map_or(default_pairs, |p| p.parse().expect("PAIRS: a number"));
    // The ordinary stream's driver calls (its id; events when a list is stolen from) are
    // answered by the simulation.
    let _sim = rmm_sys::fault::FaultScope::simulated();
    if instructions {
        println!("| resource | shape | mix | stream | instructions per pair (per op: traces) |");
    } else {
        println!("| resource | shape | mix | stream | ns per pair |");
    }
    println!("|---|---|---|---|---:|");
    for &resource in &resources {
        for &mix in &mixes {
            for &stream in &streams {
                for &shape in &shapes {
                    let name = CaseName {
                        resource,
                        shape,
                        mix,
                        stream,
                    };
                    if !instructions {
                        let ns = name.run(pairs);
                        println!("| {resource} | {shape} | {mix} | {stream} | {ns:.1} |");
                        continue;
                    }
                    let (ir, split) = name.count(pairs, steps);
                    println!("| {resource} | {shape} | {mix} | {stream} | {ir} |");
                    for (step, ir) in split {
                        println!("|   |   |   | {step} | {ir} |");
                    }
                }
            }
        }
    }
}

/// The split of a callgrind profile by step: every instruction is charged to the source file
/// it came from (inlined code included) and the `fn` enclosing its line there (read from the
/// source file when it exists, else the function it was compiled into), then classified.
mod steps {
    use super::HashMap;

    /// The steps, in print order.
    const STEPS: [&str; 10] = [
        "stream lookup",
        "list lock",
        "free list",
        "handed-out record",
        "event policy",
        "binning route",
        "arena",
        "resource and core (checks, dispatch)",
        "libc (memcpy, malloc: collection nodes)",
        "bench loop",
    ];

    /// `fn` names of a source file by line, read once.
    #[derive(Default)]
    struct Sources(HashMap<String, Vec<(usize, String)>>);

    impl Sources {
        fn enclosing(&mut self, file: &str, line: usize) -> Option<&str> {
            let fns = self.0.entry(file.to_owned()).or_insert_with(|| {
                // Debug info names this workspace's files relative to its root.
                let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
                let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
                text.lines()
                    .enumerate()
                    .filter_map(|(i, l)| {
                        let rest = l.trim_start();
                        let at = rest.find("fn ")?;
                        let before = &rest[..at];
                        let is_fn = before.split_whitespace().all(|w| {
                            w.starts_with("pub") || ["const", "unsafe", "extern"].contains(&w)
                        });
                        let name: String = rest[at + 3..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        (is_fn && !name.is_empty()).then_some((i + 1, name))
                    })
                    .collect()
            });
            fns.iter()
                .take_while(|(l, _)| *l <= line)
                .last()
                .map(|(_, n)| n.as_str())
        }
    }

    /// The step of an instruction from source `file`, in the `fn` `inner` there (when the
    /// source was found), compiled into the function `outer`.
    fn classify(file: &str, inner: Option<&str>, outer: &str) -> &'static str {
        let base = file.rsplit('/').next().unwrap_or(file);
        let inner = inner.unwrap_or("");
        if outer.contains("arena") || file.contains("/arena/") {
            return "arena";
        }
        if file.contains("parking_lot") || file.contains("lock_api") {
            // The stream lists' mutex (`crate::sync::Mutex`).
            return "list lock";
        }
        if file.contains("dashmap") || file.contains("hashbrown") {
            return "handed-out record";
        }
        if file.starts_with("./") || outer.starts_with("__mem") || outer.contains("malloc") {
            // glibc's own sources (compiled elsewhere, named relative to its build).
            return "libc (memcpy, malloc: collection nodes)";
        }
        if !file.starts_with("/rustc") {
            let crate_of = |name: &str| file.contains(name);
            match base {
                "stream_lists.rs" => {
                    return match inner {
                        "publish" | "serve" | "record" | "event" | "prepare_steal" => {
                            "event policy"
                        }
                        "lock" => "list lock",
                        _ => "stream lookup",
                    }
                }
                "event_policy.rs" => return "event policy",
                "free_list.rs" | "size_index.rs" | "ring.rs" | "boundary_list.rs" => {
                    return "free list"
                }
                "blocks.rs" if crate_of("/pool/") => {
                    return match inner {
                        "hand_out" | "take_back" | "handed_out" => "handed-out record",
                        _ => "free list",
                    }
                }
                "handed.rs" | "addr_table.rs" | "block_table.rs" | "cross_thread.rs" => {
                    return "handed-out record"
                }
                "routes.rs" => return "binning route",
                // The naive baseline counts as the benchmark's own code (it was copied into
                // this file before it moved to `testing`).
                "pair_count.rs" => return "bench loop",
                "naive.rs" if crate_of("/testing/") => return "bench loop",
                "core.rs" if matches!(inner, "list_for" | "register") => return "stream lookup",
                "resource.rs" if crate_of("/binning/") => return "binning route",
                "resource.rs" if matches!(inner, "take" | "put" | "fits") => return "free list",
                "resource.rs" if matches!(inner, "hand_out" | "take_back" | "refresh") => {
                    return "handed-out record"
                }
                _ if crate_of("rmm-stream") || crate_of("rmm-sys") => return "stream lookup",
                _ => {}
            }
            return "resource and core (checks, dispatch)";
        }
        if ["futex.rs", "mutex.rs", "poison.rs", "panicking.rs"].contains(&base) {
            return "list lock";
        }
        if file.contains("/btree/") || file.contains("/vec_deque/") {
            return "free list";
        }
        // Other standard-library code: by the function it was inlined into.
        let by_outer: [(&str, &[&str]); 6] = [
            (
                "handed-out record",
                &["block_table", "handed", "hand_out", "take_back"],
            ),
            (
                "free list",
                &[
                    "free_list",
                    "size_index",
                    "btree",
                    "vec_deque",
                    "FreeBlocks>::take",
                    "FreeBlocks>::put",
                ],
            ),
            (
                "stream lookup",
                &[
                    "list_for",
                    "cached_list_index",
                    "StreamKey",
                    "stream_get_id",
                ],
            ),
            ("event policy", &["publish", "serve", "EventPolicy"]),
            ("binning route", &["binning"]),
            ("bench loop", &["pair_count", "testing::naive"]),
        ];
        by_outer
            .iter()
            .find(|(_, parts)| parts.iter().any(|p| outer.contains(p)))
            .map_or("resource and core (checks, dispatch)", |(step, _)| step)
    }

    /// Instructions per step, over the whole profile (the self cost of every line; call
    /// lines are skipped, their callees' lines count).
    pub(super) fn split(text: &str) -> Vec<(&'static str, u64)> {
        let mut names: HashMap<(char, String), String> = HashMap::new();
        let mut name = |kind: char, v: &str| -> String {
            let v = v.trim();
            match v.strip_prefix('(').and_then(|r| r.split_once(')')) {
                Some((id, rest)) => {
                    let rest = rest.trim();
                    if !rest.is_empty() {
                        names.insert((kind, id.to_owned()), rest.to_owned());
                    }
                    names
                        .get(&(kind, id.to_owned()))
                        .cloned()
                        .unwrap_or_default()
                }
                None => v.to_owned(),
            }
        };
        let mut sources = Sources::default();
        let mut totals: HashMap<&'static str, u64> = HashMap::new();
        let (mut file, mut inlined, mut func) = (String::new(), String::new(), String::new());
        let (mut last_line, mut skip_next) = (0i64, false);
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("fl=") {
                file = name('f', v);
                inlined = file.clone();
            } else if let Some(v) = line.strip_prefix("fi=").or(line.strip_prefix("fe=")) {
                inlined = name('f', v);
            } else if let Some(v) = line.strip_prefix("fn=") {
                func = name('n', v);
                inlined = file.clone();
            } else if let Some(v) = line.strip_prefix("cfi=").or(line.strip_prefix("cfl=")) {
                name('f', v);
            } else if let Some(v) = line.strip_prefix("cfn=") {
                name('n', v);
            } else if line.starts_with("calls=") {
                skip_next = true;
            } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
                let mut parts = line.split_whitespace();
                let pos = parts.next().unwrap_or("0");
                let at = match pos {
                    "*" => last_line,
                    p if p.starts_with(['+', '-']) => last_line + p.parse::<i64>().unwrap_or(0),
                    p => p.parse().unwrap_or(0),
                };
                last_line = at;
                if std::mem::take(&mut skip_next) {
                    continue;
                }
                let ir: u64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let inner = sources
                    .enclosing(&inlined, usize::try_from(at).unwrap_or(0))
                    .map(str::to_owned);
                *totals
                    .entry(classify(&inlined, inner.as_deref(), &func))
                    .or_default() += ir;
            }
        }
        STEPS
            .iter()
            .map(|step| (*step, totals.get(step).copied().unwrap_or(0)))
            .filter(|(_, ir)| *ir > 0)
            .collect()
    }
}
