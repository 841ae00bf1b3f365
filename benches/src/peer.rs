//! The peer comparison with RMM C++: the plan file both sides replay, the results both sides
//! write, and the table of rmm-rs / RMM ratios.
//!
//! `run.sh peer` (see `docs/performance.md`) runs, on the GPU machine:
//!
//! 1. `examples/peer plan FILE`: generates the workloads (sized from the device's memory) and
//!    writes them, with the resource configurations, repetitions and thread counts, to FILE in
//!    the [plan format](#the-plan-file);
//! 2. `rmm_peer FILE RMM.tsv`: the C++ driver (`benches/peer/rmm_peer.cpp`, compiled there
//!    against the librmm wheel) replays every workload with RMM's resources;
//! 3. `examples/peer run FILE RS.tsv`: the same with rmm-rs's resources;
//! 4. `examples/peer report RS.tsv RMM.tsv`: the ratio table ([`report`]), and the table of
//!    rmm-rs's resources against the naive baseline, measured by `run` alone.
//!
//! Both sides measure a cell (workload, resource, thread count) the same way: create one
//! non-blocking stream per thread and the resource (over a statistics adaptor over the CUDA
//! resource, or the driver pool for `async`), replay the workload `warmup` times untimed and
//! `reps` times timed, each pass on `threads` threads started together at a barrier, each thread
//! replaying its own copy on its own stream (allocate and free with alignment 256, then
//! synchronize its stream); a pass costs the slowest thread's wall time / (operations x
//! threads); the cell's figure is the median of its passes. Peak reserved memory is the peak
//! of the statistics adaptor's bytes (what the resource took from the CUDA resource) or, for
//! `async`, the pool's `ReservedMemHigh` attribute, over all passes of the cell.
//!
//! # The plan file
//!
//! Text, one record a line, fields separated by single spaces, `#` lines ignored:
//!
//! ```text
//! rmm-peer-plan 1
//! reps 3
//! warmup 1
//! threads 1 4 16
//! resource pool 0                 # initial pool size in bytes; grows on demand
//! resource arena 75161927680      # arena size in bytes
//! resource binning 18 22          # bins 2^18..2^22 over a pool of initial size 0
//! resource async                  # the driver's pool, RMM's defaults
//! resource cuda                   # cuMemAlloc / cuMemFree; one thread only
//! resource fixed_size 4194304     # workloads whose largest allocation is at most this;
//!                                 #   block = that largest allocation, 128 blocks a chunk
//! resource naive 75161927680      # rmm-rs only: the naive baseline over one region
//! workload a 1024 20000 1 B-4 MiB, ~1000 live   # name, slots, operations, description
//! a 0 1234                        # allocate 1234 bytes into slot 0
//! f 0                             # free slot 0
//! ...
//! end
//! ```
//!
//! Every workload is followed by exactly its number of operation lines and `end`. Which cells
//! a resource runs is [`PeerResource::runs`]; both sides apply it.

use std::fmt;
use std::io::{self, BufRead, Write};

use crate::sizing::{live_count_within, DeviceMemory, MIB};
use crate::table::{mib, num, ratio, Table};
use crate::{Op, Trace};

/// The first line of a plan file.
pub const PLAN_MAGIC: &str = "rmm-peer-plan 1";

/// The header line of a results file (RMM's side: seven fields).
pub const RESULTS_HEADER: &str =
    "side\tworkload\tresource\tthreads\tns_per_op\tpeak_reserved\tstatus";

/// The header line of a results file with the optional eighth field, the peak of the bytes the
/// workload holds live on all threads together (rmm-rs's side writes it).
pub const RESULTS_HEADER_LIVE: &str =
    "side\tworkload\tresource\tthreads\tns_per_op\tpeak_reserved\tstatus\tpeak_live";

/// A resource both sides build the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerResource {
    /// `pool_memory_resource` over the CUDA resource, this initial size, no maximum.
    Pool {
        /// Initial pool size in bytes (0: grow on first use).
        initial: usize,
    },
    /// `arena_memory_resource` of this size over the CUDA resource.
    Arena {
        /// Arena size in bytes.
        bytes: usize,
    },
    /// `binning_memory_resource` with fixed-size bins `2^min_exp..=2^max_exp` over a pool of
    /// initial size 0 over the CUDA resource.
    Binning {
        /// Smallest bin exponent.
        min_exp: u32,
        /// Largest bin exponent.
        max_exp: u32,
    },
    /// `cuda_async_memory_resource` with RMM's defaults (release threshold `u64::MAX`).
    Async,
    /// `cuda_memory_resource` (`cuMemAlloc` / `cuMemFree`) under the statistics adaptor, on one
    /// thread only (`cuMemFree` synchronizes the device: more threads only queue).
    Cuda,
    /// `fixed_size_memory_resource` over the CUDA resource, 128 blocks a chunk, its block the
    /// workload's largest allocation, for workloads whose largest allocation is at most
    /// `max_block` bytes.
    FixedSize {
        /// The largest block size a workload may need to be run.
        max_block: usize,
    },
    /// rmm-rs only (RMM has none; its driver skips it): the naive baseline
    /// ([`NaiveBestFit`](crate::naive::NaiveBestFit)) over one region of `bytes`.
    Naive {
        /// Region size in bytes.
        bytes: usize,
    },
}

impl PeerResource {
    /// The name used in plans, results and tables.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pool { .. } => "pool",
            Self::Arena { .. } => "arena",
            Self::Binning { .. } => "binning",
            Self::Async => "async",
            Self::Cuda => "cuda",
            Self::FixedSize { .. } => "fixed_size",
            Self::Naive { .. } => "naive",
        }
    }

    /// Whether both sides measure this resource on `workload` with `threads` threads: `cuda`
    /// on one thread only, `fixed_size` where the workload's largest allocation fits its
    /// `max_block`; `naive` only on the rmm-rs side ([`Self::is_baseline`]).
    #[must_use]
    pub fn runs(&self, workload: &Trace, threads: usize) -> bool {
        match *self {
            Self::Cuda => threads == 1,
            Self::FixedSize { max_block } => workload.largest() <= max_block,
            _ => true,
        }
    }

    /// Whether this is the naive baseline, which only rmm-rs's side measures.
    #[must_use]
    pub fn is_baseline(&self) -> bool {
        matches!(self, Self::Naive { .. })
    }
}

impl fmt::Display for PeerResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Pool { initial } => write!(f, "pool {initial}"),
            Self::Arena { bytes } => write!(f, "arena {bytes}"),
            Self::Binning { min_exp, max_exp } => write!(f, "binning {min_exp} {max_exp}"),
            Self::Async => f.write_str("async"),
            Self::Cuda => f.write_str("cuda"),
            Self::FixedSize { max_block } => write!(f, "fixed_size {max_block}"),
            Self::Naive { bytes } => write!(f, "naive {bytes}"),
        }
    }
}

/// One workload: a trace every thread replays a copy of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerWorkload {
    /// Short name (no spaces).
    pub name: String,
    /// What it is, for the tables.
    pub description: String,
    /// The operations.
    pub trace: Trace,
}

/// Everything both sides need to replay the same cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPlan {
    /// Timed passes per cell.
    pub reps: usize,
    /// Untimed passes per cell, before the timed ones.
    pub warmup: usize,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Resources, in table order.
    pub resources: Vec<PeerResource>,
    /// Workloads, in table order.
    pub workloads: Vec<PeerWorkload>,
}

/// A malformed plan or results file: the line (1-based) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerError {
    /// The line, 1-based (0: the end of the file).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "at the end of the file: {}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for PeerError {}

fn err(line: usize, message: impl Into<String>) -> PeerError {
    PeerError {
        line,
        message: message.into(),
    }
}

/// Writes `plan` in the plan format.
pub fn write_plan(plan: &PeerPlan, w: &mut impl Write) -> io::Result<()> {
    writeln!(w, "{PLAN_MAGIC}")?;
    writeln!(
        w,
        "# written by rmm-rs benches/examples/peer.rs; read by benches/peer/rmm_peer.cpp"
    )?;
    writeln!(w, "reps {}", plan.reps)?;
    writeln!(w, "warmup {}", plan.warmup)?;
    let threads: Vec<String> = plan.threads.iter().map(usize::to_string).collect();
    writeln!(w, "threads {}", threads.join(" "))?;
    for r in &plan.resources {
        writeln!(w, "resource {r}")?;
    }
    for wl in &plan.workloads {
        writeln!(
            w,
            "workload {} {} {} {}",
            wl.name,
            wl.trace.slots,
            wl.trace.ops.len(),
            wl.description
        )?;
        for op in &wl.trace.ops {
            match *op {
                Op::Alloc { slot, size } => writeln!(w, "a {slot} {size}")?,
                Op::Free { slot } => writeln!(w, "f {slot}")?,
            }
        }
        writeln!(w, "end")?;
    }
    Ok(())
}

fn parse_num<T: std::str::FromStr>(
    line: usize,
    field: Option<&str>,
    what: &str,
) -> Result<T, PeerError> {
    let field = field.ok_or_else(|| err(line, format!("missing {what}")))?;
    field
        .parse()
        .map_err(|_| err(line, format!("{what} `{field}` is not a number")))
}

/// Reads a plan written by [`write_plan`]; every malformed line is an error naming it. Slots
/// are checked: an allocation into a live slot, a free of an empty slot, a slot out of range
/// and allocations left live at the end are errors.
pub fn read_plan(r: impl BufRead) -> Result<PeerPlan, PeerError> {
    let mut plan = PeerPlan {
        reps: 0,
        warmup: 0,
        threads: Vec::new(),
        resources: Vec::new(),
        workloads: Vec::new(),
    };
    let mut lines = r.lines().enumerate().map(|(i, l)| (i + 1, l));
    let mut next = move || -> Result<Option<(usize, String)>, PeerError> {
        for (n, line) in lines.by_ref() {
            let line = line.map_err(|e| err(n, format!("cannot read: {e}")))?;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            return Ok(Some((n, trimmed.to_owned())));
        }
        Ok(None)
    };
    match next()? {
        Some((_, l)) if l == PLAN_MAGIC => {}
        Some((n, l)) => return Err(err(n, format!("expected `{PLAN_MAGIC}`, found `{l}`"))),
        None => return Err(err(0, "empty plan")),
    }
    let (mut seen_reps, mut seen_warmup) = (false, false);
    while let Some((n, line)) = next()? {
        let mut f = line.split(' ');
        match f.next() {
            Some("reps") => {
                plan.reps = parse_num(n, f.next(), "reps")?;
                seen_reps = true;
            }
            Some("warmup") => {
                plan.warmup = parse_num(n, f.next(), "warmup")?;
                seen_warmup = true;
            }
            Some("threads") => {
                plan.threads = f
                    .map(|t| parse_num(n, Some(t), "thread count"))
                    .collect::<Result<_, _>>()?;
                if plan.threads.is_empty() || plan.threads.contains(&0) {
                    return Err(err(n, "thread counts must be at least 1"));
                }
            }
            Some("resource") => {
                let r = match f.next() {
                    Some("pool") => PeerResource::Pool {
                        initial: parse_num(n, f.next(), "initial pool size")?,
                    },
                    Some("arena") => PeerResource::Arena {
                        bytes: parse_num(n, f.next(), "arena size")?,
                    },
                    Some("binning") => PeerResource::Binning {
                        min_exp: parse_num(n, f.next(), "smallest bin exponent")?,
                        max_exp: parse_num(n, f.next(), "largest bin exponent")?,
                    },
                    Some("async") => PeerResource::Async,
                    Some("cuda") => PeerResource::Cuda,
                    Some("fixed_size") => PeerResource::FixedSize {
                        max_block: parse_num(n, f.next(), "largest block size")?,
                    },
                    Some("naive") => PeerResource::Naive {
                        bytes: parse_num(n, f.next(), "region size")?,
                    },
                    other => {
                        return Err(err(
                            n,
                            format!("unknown resource `{}`", other.unwrap_or("")),
                        ))
                    }
                };
                plan.resources.push(r);
            }
            Some("workload") => {
                let name: String = f.next().unwrap_or_default().to_owned();
                if name.is_empty() {
                    return Err(err(n, "missing workload name"));
                }
                let slots: usize = parse_num(n, f.next(), "slot count")?;
                let count: usize = parse_num(n, f.next(), "operation count")?;
                let description = f.collect::<Vec<_>>().join(" ");
                let mut ops = Vec::with_capacity(count);
                let mut live = vec![false; slots];
                for _ in 0..count {
                    let (m, l) = next()?.ok_or_else(|| {
                        err(
                            0,
                            format!("workload {name} ends before its {count} operations"),
                        )
                    })?;
                    let mut g = l.split(' ');
                    let kind = g.next();
                    let slot: u32 = parse_num(m, g.next(), "slot")?;
                    let cell = live
                        .get_mut(slot as usize)
                        .ok_or_else(|| err(m, format!("slot {slot} out of range (< {slots})")))?;
                    match kind {
                        Some("a") => {
                            let size: usize = parse_num(m, g.next(), "size")?;
                            if std::mem::replace(cell, true) {
                                return Err(err(m, format!("allocation into live slot {slot}")));
                            }
                            ops.push(Op::Alloc { slot, size });
                        }
                        Some("f") => {
                            if !std::mem::replace(cell, false) {
                                return Err(err(m, format!("free of empty slot {slot}")));
                            }
                            ops.push(Op::Free { slot });
                        }
                        _ => {
                            return Err(err(
                                m,
                                format!("expected `a SLOT SIZE` or `f SLOT`, found `{l}`"),
                            ))
                        }
                    }
                    if g.next().is_some() {
                        return Err(err(m, format!("extra fields in `{l}`")));
                    }
                }
                match next()? {
                    Some((_, l)) if l == "end" => {}
                    Some((m, l)) => {
                        return Err(err(
                            m,
                            format!("expected `end` after workload {name}, found `{l}`"),
                        ))
                    }
                    None => return Err(err(0, format!("missing `end` after workload {name}"))),
                }
                if live.iter().any(|&l| l) {
                    return Err(err(n, format!("workload {name} leaves allocations live")));
                }
                plan.workloads.push(PeerWorkload {
                    name,
                    description,
                    trace: Trace { ops, slots },
                });
            }
            _ => return Err(err(n, format!("unknown record `{line}`"))),
        }
    }
    if !seen_reps || !seen_warmup || plan.threads.is_empty() {
        return Err(err(0, "the plan lacks `reps`, `warmup` or `threads`"));
    }
    if plan.reps == 0 {
        return Err(err(0, "reps must be at least 1"));
    }
    Ok(plan)
}

/// The knobs of [`standard_plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    /// Operations per thread in each workload (the RMM sequences make `ops / 2` allocations).
    pub ops: usize,
    /// Timed passes per cell.
    pub reps: usize,
    /// Untimed passes per cell.
    pub warmup: usize,
    /// Thread counts.
    pub threads: Vec<usize>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            ops: 20_000,
            reps: 3,
            warmup: 1,
            threads: vec![1, 4, 16],
        }
    }
}

/// The comparison's workloads and resources, sized from the device's memory:
///
/// - `a`, `b`: `gpu_alloc`'s traces (a) 1 B-4 MiB with about 1,000 live and (b) 1 B-64 KiB
///   with about 2,000 live ([`Trace::random`]), fewer live where the largest thread count's
///   copies would not fit in half the free memory;
/// - `r1`, `r64`: RMM's `random_allocations` sequence ([`Trace::rmm_random`]) with `ops / 2`
///   allocations up to 1 MiB and up to 64 MiB, `max_usage` the device's live budget divided
///   by the largest thread count;
/// - resources `pool` (initial size 0), `arena` (90 % of the free memory), `binning` (bins
///   256 KiB..4 MiB over a pool of initial size 0), `async` (the driver's pool), `cuda` (one
///   thread), `fixed_size` (workloads up to 4 MiB: `a`, `b`, `r1`) and, rmm-rs only, `naive`
///   (one region of the arena's size).
#[must_use]
pub fn standard_plan(options: &PlanOptions, mem: &DeviceMemory) -> PeerPlan {
    let ops = options.ops;
    let max_t = options.threads.iter().copied().max().unwrap_or(1);
    // Every thread replays its own copy: the live bytes of `max_t` copies must fit.
    let budget = mem.free / 2;
    let live_a = live_count_within(1000, 4 * MIB, max_t, budget);
    let live_b = live_count_within(2000, 64 << 10, max_t, budget);
    let usage = mem.live_budget() / max_t;
    let rmm = |name: &str, max: usize, seed: u64| PeerWorkload {
        name: name.into(),
        description: format!(
            "RMM random_allocations: {} allocations up to {}, max_usage {} MiB per thread",
            ops / 2,
            crate::table::size_name(max),
            usage / MIB
        ),
        trace: Trace::rmm_random(ops / 2, max, usage, seed),
    };
    let workloads = vec![
        PeerWorkload {
            name: "a".into(),
            description: format!("gpu_alloc trace (a): 1 B-4 MiB, ~{live_a} live"),
            trace: Trace::random(ops, 1, 4 * MIB, live_a, 0xbe_2c4),
        },
        PeerWorkload {
            name: "b".into(),
            description: format!("gpu_alloc trace (b): 1 B-64 KiB, ~{live_b} live"),
            trace: Trace::random(ops, 1, 64 << 10, live_b, 0xbe_2c5),
        },
        rmm("r1", MIB, 0x5eed_0001),
        rmm("r64", 64 * MIB, 0x5eed_0040),
    ];
    PeerPlan {
        reps: options.reps,
        warmup: options.warmup,
        threads: options.threads.clone(),
        resources: vec![
            PeerResource::Pool { initial: 0 },
            PeerResource::Arena {
                bytes: mem.arena_bytes(),
            },
            PeerResource::Binning {
                min_exp: 18,
                max_exp: 22,
            },
            PeerResource::Async,
            PeerResource::Cuda,
            PeerResource::FixedSize {
                max_block: fixed_size_max_block(&workloads, max_t, mem),
            },
            PeerResource::Naive {
                bytes: mem.arena_bytes(),
            },
        ],
        workloads,
    }
}

/// The largest block up to 4 MiB for which every workload whose largest allocation is at most
/// it fits a fixed-size resource on `threads` threads: a whole block per live allocation, in
/// 80 % of the free memory (0: none fits).
fn fixed_size_max_block(workloads: &[PeerWorkload], threads: usize, mem: &DeviceMemory) -> usize {
    let fits = |w: &PeerWorkload| {
        w.trace
            .peak_count()
            .saturating_mul(w.trace.largest())
            .saturating_mul(threads)
            <= mem.free / 10 * 8
    };
    let mut sizes: Vec<usize> = workloads
        .iter()
        .map(|w| w.trace.largest())
        .filter(|&s| s <= 4 * MIB)
        .collect();
    sizes.sort_unstable();
    sizes
        .into_iter()
        .take_while(|&s| {
            workloads
                .iter()
                .filter(|w| w.trace.largest() <= s)
                .all(fits)
        })
        .last()
        .unwrap_or(0)
}

/// One measured cell, as both sides write it.
#[derive(Debug, Clone, PartialEq)]
pub struct CellResult {
    /// `rmm-rs` or `rmm`.
    pub side: String,
    /// Workload name.
    pub workload: String,
    /// Resource name.
    pub resource: String,
    /// Thread count.
    pub threads: usize,
    /// Median nanoseconds per operation, `None` when the cell failed.
    pub ns_per_op: Option<f64>,
    /// Peak bytes reserved by the resource, when known.
    pub peak_reserved: Option<u64>,
    /// `ok`, or `error: ...`.
    pub status: String,
    /// The most bytes the workload holds live at once on all threads together (the trace's
    /// peak times the thread count: threads start together, so their peaks meet), when the
    /// side wrote it.
    pub peak_live: Option<u64>,
}

impl CellResult {
    /// The cell as one line of a results file (no newline).
    #[must_use]
    pub fn to_line(&self) -> String {
        let status: String = self
            .status
            .chars()
            .map(|c| {
                if c == '\t' || c == '\n' || c == '\r' {
                    ' '
                } else {
                    c
                }
            })
            .collect();
        let mut line = format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.side,
            self.workload,
            self.resource,
            self.threads,
            self.ns_per_op.map_or("-".to_owned(), |v| format!("{v:.1}")),
            self.peak_reserved.map_or("-".to_owned(), |v| v.to_string()),
            status
        );
        if let Some(live) = self.peak_live {
            line.push_str(&format!("\t{live}"));
        }
        line
    }
}

/// A results file: its `#` lines (device, versions) and its cells.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Results {
    /// The `#` lines without the `#`, trimmed.
    pub notes: Vec<String>,
    /// The cells in file order.
    pub cells: Vec<CellResult>,
}

/// Reads a results file (header line optional, `#` lines kept as notes).
pub fn read_results(text: &str) -> Result<Results, PeerError> {
    let mut out = Results::default();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line == RESULTS_HEADER || line == RESULTS_HEADER_LIVE {
            continue;
        }
        if let Some(note) = line.strip_prefix('#') {
            out.notes.push(note.trim().to_owned());
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 7 && f.len() != 8 {
            return Err(err(
                n,
                format!("expected 7 or 8 tab-separated fields, found {}", f.len()),
            ));
        }
        fn opt(s: &str) -> Option<&str> {
            (s != "-").then_some(s)
        }
        let ns_per_op = opt(f[4])
            .map(|v| parse_num::<f64>(n, Some(v), "ns_per_op"))
            .transpose()?;
        let peak_reserved = opt(f[5])
            .map(|v| parse_num::<u64>(n, Some(v), "peak_reserved"))
            .transpose()?;
        out.cells.push(CellResult {
            side: f[0].to_owned(),
            workload: f[1].to_owned(),
            resource: f[2].to_owned(),
            threads: parse_num(n, Some(f[3]), "threads")?,
            ns_per_op,
            peak_reserved,
            status: f[6].to_owned(),
            peak_live: f
                .get(7)
                .and_then(|&v| opt(v))
                .map(|v| parse_num::<u64>(n, Some(v), "peak_live"))
                .transpose()?,
        });
    }
    Ok(out)
}

/// The comparison: the summary table (rmm-rs / RMM per workload and resource, one column per
/// thread count), the detail table (both figures, the ratio, both peaks reserved and their
/// ratios to the peak live bytes per cell), the table of rmm-rs's resources against the naive
/// baseline of the same run, the number of cells compared and the number where a side failed
/// or is missing.
#[derive(Debug, Clone)]
pub struct Report {
    /// Ratios only.
    pub summary: Table,
    /// Every cell.
    pub detail: Table,
    /// rmm-rs's ns per operation over the naive baseline's, per workload, resource and thread
    /// count (`None` when rmm-rs's side measured no baseline).
    pub baseline: Option<Table>,
    /// Cells with both figures.
    pub compared: usize,
    /// Cells where a side failed or has no row.
    pub failed: usize,
}

/// The name of the naive baseline's cells.
const BASELINE: &str = "naive";

/// `reserved / live`, two decimals, or `n/a`.
fn per_live(reserved: Option<u64>, live: Option<u64>) -> String {
    match (reserved, live) {
        (Some(r), Some(l)) if l > 0 => format!("{:.2}", r as f64 / l as f64),
        _ => "n/a".to_owned(),
    }
}

/// Compares rmm-rs's cells (`ours`, in their order) with RMM's (`theirs`); the naive
/// baseline's cells (ours only) make the baseline table and are not compared.
#[must_use]
pub fn report(ours: &[CellResult], theirs: &[CellResult]) -> Report {
    let find = |cells: &[CellResult], workload: &str, resource: &str, threads: usize| {
        cells
            .iter()
            .find(|t| t.workload == workload && t.resource == resource && t.threads == threads)
            .cloned()
    };
    let mut threads: Vec<usize> = ours.iter().chain(theirs).map(|c| c.threads).collect();
    threads.sort_unstable();
    threads.dedup();
    let mut headers = vec!["workload".to_owned(), "resource".to_owned()];
    headers.extend(threads.iter().map(|t| format!("{t} thr.")));
    let mut summary = Table::new(&headers, 2);
    let mut detail = Table::new(
        &[
            "workload",
            "resource",
            "threads",
            "rmm-rs ns/op",
            "RMM ns/op",
            "rmm-rs / RMM",
            "peak reserved rmm-rs",
            "peak reserved RMM",
            "peak live",
            "reserved / live rmm-rs",
            "reserved / live RMM",
            "note",
        ],
        2,
    )
    .text_columns(&[11]);
    let (mut compared, mut failed) = (0, 0);
    // Keys (workload, resource) in first-seen order, ours first, then any only RMM has.
    let mut keys: Vec<(String, String)> = Vec::new();
    for c in ours.iter().chain(theirs) {
        let k = (c.workload.clone(), c.resource.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (workload, resource) in keys.iter().filter(|(_, r)| r != BASELINE) {
        let mut ratios = vec![workload.clone(), resource.clone()];
        for &t in &threads {
            let (a, b) = (
                find(ours, workload, resource, t),
                find(theirs, workload, resource, t),
            );
            if a.is_none() && b.is_none() {
                ratios.push(String::new());
                continue;
            }
            let (av, bv) = (
                a.as_ref().and_then(|c| c.ns_per_op),
                b.as_ref().and_then(|c| c.ns_per_op),
            );
            if av.is_some() && bv.is_some() {
                compared += 1;
            } else {
                failed += 1;
            }
            let note = [("rmm-rs", &a), ("RMM", &b)]
                .iter()
                .filter_map(|(side, c)| match c {
                    None => Some(format!("{side}: no result")),
                    Some(c) if c.status != "ok" => Some(format!("{side}: {}", c.status)),
                    Some(_) => None,
                })
                .collect::<Vec<_>>()
                .join("; ");
            let (ar, br) = (
                a.as_ref().and_then(|c| c.peak_reserved),
                b.as_ref().and_then(|c| c.peak_reserved),
            );
            let live = a
                .as_ref()
                .and_then(|c| c.peak_live)
                .or(b.as_ref().and_then(|c| c.peak_live));
            ratios.push(ratio(av, bv));
            detail.row([
                workload.clone(),
                resource.clone(),
                t.to_string(),
                num(av),
                num(bv),
                ratio(av, bv),
                mib(ar),
                mib(br),
                mib(live),
                per_live(ar, live),
                per_live(br, live),
                note,
            ]);
        }
        summary.row(ratios);
    }
    let baseline = ours.iter().any(|c| c.resource == BASELINE).then(|| {
        let mut table = Table::new(&headers, 2);
        for (workload, resource) in keys.iter().filter(|(_, r)| r != BASELINE) {
            let mut row = vec![workload.clone(), resource.clone()];
            let mut any = false;
            for &t in &threads {
                let (a, base) = (
                    find(ours, workload, resource, t),
                    find(ours, workload, BASELINE, t),
                );
                match a {
                    Some(a) => {
                        any = true;
                        row.push(ratio(a.ns_per_op, base.and_then(|b| b.ns_per_op)));
                    }
                    None => row.push(String::new()),
                }
            }
            if any {
                table.row(row);
            }
        }
        table
    });
    Report {
        summary,
        detail,
        baseline,
        compared,
        failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> PeerPlan {
        PeerPlan {
            reps: 3,
            warmup: 1,
            threads: vec![1, 4, 16],
            resources: vec![
                PeerResource::Pool { initial: 0 },
                PeerResource::Arena { bytes: 1 << 30 },
                PeerResource::Binning {
                    min_exp: 18,
                    max_exp: 22,
                },
                PeerResource::Async,
                PeerResource::Cuda,
                PeerResource::FixedSize { max_block: 1 << 22 },
                PeerResource::Naive { bytes: 1 << 30 },
            ],
            workloads: vec![
                PeerWorkload {
                    name: "a".into(),
                    description: "1 B-4 MiB, ~10 live".into(),
                    trace: Trace::random(500, 1, 4 << 20, 10, 1),
                },
                PeerWorkload {
                    name: "r".into(),
                    description: "RMM random".into(),
                    trace: Trace::rmm_random(300, 1 << 20, 64 << 20, 2),
                },
            ],
        }
    }

    fn text(p: &PeerPlan) -> String {
        let mut buf = Vec::new();
        write_plan(p, &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn plans_round_trip() {
        let p = plan();
        let t = text(&p);
        assert!(t.starts_with("rmm-peer-plan 1\n"));
        assert!(t.contains("\nresource binning 18 22\n"));
        assert!(t.contains("\nresource cuda\nresource fixed_size 4194304\nresource naive"));
        assert!(t.contains("\nworkload a "));
        assert_eq!(read_plan(t.as_bytes()).unwrap(), p);
        assert_eq!(PeerResource::Arena { bytes: 5 }.name(), "arena");
    }

    #[test]
    fn which_cells_a_resource_runs() {
        let p = plan();
        let (a, r) = (&p.workloads[0].trace, &p.workloads[1].trace);
        assert!(a.largest() > 1 << 20 && r.largest() <= 1 << 20);
        let fixed = PeerResource::FixedSize { max_block: 1 << 20 };
        assert!(fixed.runs(r, 16) && !fixed.runs(a, 1));
        assert!(PeerResource::Cuda.runs(r, 1) && !PeerResource::Cuda.runs(a, 4));
        assert!(PeerResource::Async.runs(r, 16));
        assert!(PeerResource::Naive { bytes: 1 }.is_baseline());
        assert!(!PeerResource::Pool { initial: 0 }.is_baseline());
    }

    #[test]
    fn malformed_plans_name_the_line() {
        let p = plan();
        let good = text(&p);
        let bad = |from: &str, to: &str| -> PeerError {
            assert!(good.contains(from), "{from}");
            read_plan(good.replacen(from, to, 1).as_bytes()).unwrap_err()
        };
        assert_eq!(bad("rmm-peer-plan 1", "rmm-peer-plan 2").line, 1);
        let e = bad("reps 3", "reps three");
        assert_eq!(
            (e.line, e.message.as_str()),
            (3, "reps `three` is not a number")
        );
        assert!(bad("resource async", "resource warp")
            .message
            .contains("unknown resource `warp`"));
        assert!(bad("resource fixed_size 4194304", "resource fixed_size")
            .message
            .contains("missing largest block size"));
        assert!(bad("threads 1 4 16", "threads 1 0")
            .message
            .contains("at least 1"));
        // The first operation of workload a: change its kind, its slot, or drop the end.
        let first_op = good
            .lines()
            .position(|l| l.starts_with("workload a"))
            .unwrap()
            + 1;
        let op_line = good.lines().nth(first_op).unwrap().to_owned();
        let e = bad(&format!("\n{op_line}\n"), "\nx 0\n");
        assert_eq!(e.line, first_op + 1);
        assert!(e.message.contains("expected `a SLOT SIZE`"), "{e}");
        let e = bad(&format!("\n{op_line}\n"), "\nf 0\n");
        assert!(e.message.contains("free of empty slot 0"), "{e}");
        let e = bad(
            &format!("\n{op_line}\n"),
            &format!("\n{op_line}\na 999999 1\n"),
        );
        assert!(e.message.contains("out of range"), "{e}");
        let e = read_plan(good.trim_end().trim_end_matches("end").as_bytes()).unwrap_err();
        assert!(e.message.contains("missing `end`"), "{e}");
        assert!(read_plan("".as_bytes())
            .unwrap_err()
            .message
            .contains("empty"));
        let e = read_plan("rmm-peer-plan 1\nreps 1\n".as_bytes()).unwrap_err();
        assert_eq!(e.line, 0);
        assert!(e.to_string().starts_with("at the end of the file"));
    }

    #[test]
    fn a_workload_that_leaks_is_refused() {
        let t = "rmm-peer-plan 1\nreps 1\nwarmup 0\nthreads 1\nworkload w 1 1 leak\na 0 5\nend\n";
        let e = read_plan(t.as_bytes()).unwrap_err();
        assert!(e.message.contains("leaves allocations live"), "{e}");
    }

    /// `rmm-mr`'s host benchmark `pair_count` replays these traces, from the same generators
    /// (`rmm_mr::testing::trace`) with its own copy of the plan's parameters (it cannot depend
    /// on this crate), and checks them against the same figures (`benches/common/mod.rs`,
    /// `traces::PINNED`): operations, sum of the allocated sizes, slots.
    #[test]
    fn pair_count_traces_match() {
        let h100 = DeviceMemory {
            free: 79 << 30,
            total: 80 << 30,
        };
        let plan = standard_plan(&PlanOptions::default(), &h100);
        let prints: Vec<(&str, (usize, usize, usize))> = plan
            .workloads
            .iter()
            .map(|w| {
                let bytes = w
                    .trace
                    .ops
                    .iter()
                    .map(|op| match *op {
                        Op::Alloc { size, .. } => size,
                        Op::Free { .. } => 0,
                    })
                    .sum();
                (w.name.as_str(), (w.trace.ops.len(), bytes, w.trace.slots))
            })
            .collect();
        assert_eq!(
            prints,
            [
                ("a", (20_000, 21_078_149_594, 1001)),
                ("b", (20_000, 324_932_589, 2001)),
                ("r1", (20_000, 4_685_516_381, 2395)),
                ("r64", (20_000, 281_108_201_673, 49)),
            ]
        );
    }

    #[test]
    fn the_standard_plan_fits_an_h100_and_a_16_gb_gpu() {
        let h100 = DeviceMemory {
            free: 80_500 * MIB,
            total: 81_559 * MIB,
        };
        let plan = standard_plan(&PlanOptions::default(), &h100);
        assert_eq!(plan.threads, vec![1, 4, 16]);
        let names: Vec<&str> = plan.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "r1", "r64"]);
        assert!(plan.workloads[0].description.contains("~1000 live"));
        for w in &plan.workloads {
            let peak = w.trace.peak_bytes() * 16;
            assert!(peak < h100.free / 2, "{}: {peak}", w.name);
            assert!(w.trace.ops.len() <= 20_000 + 10, "{}", w.trace.ops.len());
        }
        assert!(plan.resources.contains(&PeerResource::Arena {
            bytes: h100.arena_bytes()
        }));
        // The fixed-size resource runs a, b and r1 (a whole block per live allocation fits).
        let fixed = plan
            .resources
            .iter()
            .find(|r| r.name() == "fixed_size")
            .unwrap();
        let runs: Vec<&str> = plan
            .workloads
            .iter()
            .filter(|w| fixed.runs(&w.trace, 16))
            .map(|w| w.name.as_str())
            .collect();
        assert_eq!(runs, ["a", "b", "r1"]);
        // It survives its own file format.
        let back = read_plan(text(&plan).as_bytes()).unwrap();
        assert_eq!(back, plan);

        let small = DeviceMemory {
            free: 15 << 30,
            total: 16 << 30,
        };
        let plan = standard_plan(&PlanOptions::default(), &small);
        for w in &plan.workloads {
            assert!(w.trace.peak_bytes() * 16 < small.free / 2, "{}", w.name);
        }
        // There trace a does not fit a whole 4 MiB block per live allocation 16 times over.
        let fixed = plan
            .resources
            .iter()
            .find(|r| r.name() == "fixed_size")
            .unwrap();
        assert!(!fixed.runs(&plan.workloads[0].trace, 16));
    }

    fn cell(side: &str, w: &str, r: &str, t: usize, ns: Option<f64>) -> CellResult {
        CellResult {
            side: side.into(),
            workload: w.into(),
            resource: r.into(),
            threads: t,
            ns_per_op: ns,
            peak_reserved: ns.map(|_| 3 << 20),
            peak_live: (side == "rmm-rs").then_some(2 << 20),
            status: if ns.is_some() {
                "ok".into()
            } else {
                "error: out of memory\tx".into()
            },
        }
    }

    #[test]
    fn results_round_trip() {
        let cells = vec![
            cell("rmm-rs", "a", "pool", 1, Some(408.04)),
            cell("rmm-rs", "a", "pool", 16, None),
        ];
        let mut text = format!("# device: H100\n{RESULTS_HEADER_LIVE}\n");
        for c in &cells {
            text.push_str(&c.to_line());
            text.push('\n');
        }
        // RMM's side writes seven fields: no peak live.
        text.push_str(&format!("{RESULTS_HEADER}\nrmm\ta\tpool\t1\t12.5\t-\tok\n"));
        let back = read_results(&text).unwrap();
        assert_eq!(back.notes, vec!["device: H100".to_owned()]);
        assert_eq!(back.cells[0].ns_per_op, Some(408.0));
        assert_eq!(back.cells[0].peak_live, Some(2 << 20));
        assert_eq!(back.cells[2].peak_live, None);
        assert_eq!(back.cells[2].ns_per_op, Some(12.5));
        assert_eq!(back.cells[1].status, "error: out of memory x");
        assert_eq!(back.cells[1].ns_per_op, None);
        let e = read_results("rmm\ta\tpool\t1\t12\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = read_results("rmm\ta\tpool\tone\t12\t-\tok\n").unwrap_err();
        assert!(e.message.contains("threads"), "{e}");
    }

    #[test]
    fn report_pairs_cells_and_counts_failures() {
        let ours = vec![
            cell("rmm-rs", "a", "pool", 1, Some(400.0)),
            cell("rmm-rs", "a", "pool", 16, Some(100.0)),
            cell("rmm-rs", "a", "arena", 1, None),
        ];
        let theirs = vec![
            cell("rmm", "a", "pool", 1, Some(1600.0)),
            cell("rmm", "a", "pool", 16, Some(4000.0)),
            cell("rmm", "a", "arena", 1, Some(900.0)),
            cell("rmm", "b", "async", 4, Some(900.0)),
        ];
        let r = report(&ours, &theirs);
        assert!(r.baseline.is_none(), "no naive cells, no baseline table");
        assert_eq!((r.compared, r.failed), (2, 2));
        let summary = r.summary.render();
        assert!(
            summary.contains("| workload | resource | 1 thr. | 4 thr. | 16 thr. |"),
            "{summary}"
        );
        assert!(
            summary.contains("| a | pool | 0.25 |  | 0.025 |"),
            "{summary}"
        );
        assert!(summary.contains("| a | arena | n/a |  |  |"), "{summary}");
        let detail = r.detail.render();
        assert!(
            detail.contains(
                "| a | pool | 1 | 400 | 1600 | 0.25 | 3 MiB | 3 MiB | 2 MiB | 1.50 | 1.50 |  |"
            ),
            "{detail}"
        );
        assert!(detail.contains("rmm-rs: error: out of memory"), "{detail}");
        assert!(
            detail.contains(
                "| b | async | 4 | failed | 900 | n/a | n/a | 3 MiB | n/a | n/a | n/a | \
                 rmm-rs: no result |"
            ),
            "{detail}"
        );
    }

    #[test]
    fn the_naive_baseline_is_a_table_of_its_own() {
        let ours = vec![
            cell("rmm-rs", "a", "pool", 1, Some(100.0)),
            cell("rmm-rs", "a", "naive", 1, Some(400.0)),
            cell("rmm-rs", "a", "fixed_size", 1, Some(40.0)),
            cell("rmm-rs", "a", "naive", 4, None),
            cell("rmm-rs", "a", "pool", 4, Some(50.0)),
        ];
        let theirs = vec![
            cell("rmm", "a", "pool", 1, Some(1000.0)),
            cell("rmm", "a", "pool", 4, Some(1000.0)),
            cell("rmm", "a", "fixed_size", 1, Some(200.0)),
        ];
        let r = report(&ours, &theirs);
        // The baseline is neither compared nor counted as failed.
        assert_eq!((r.compared, r.failed), (3, 0));
        assert!(!r.summary.render().contains("naive"));
        let base = r.baseline.expect("a baseline table").render();
        assert!(base.contains("| a | pool | 0.25 | n/a |"), "{base}");
        assert!(base.contains("| a | fixed_size | 0.10 |  |"), "{base}");
        assert!(!base.contains("| a | naive |"), "{base}");
    }
}
