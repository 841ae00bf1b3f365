//! Fragmentation, measured: the scenarios of the `fragmentation` benchmark (RMM issues 1957 and
//! 496, and the multi-stream workload of issue 2039's shape) for rmm-rs's resources, and the
//! peer comparison of the same scenarios with RMM C++ (`run.sh peer-frag`).
//!
//! `run.sh peer-frag` runs, on the GPU machine:
//!
//! 1. `examples/peer frag-plan FILE [--quick]`: the maximum `M` (40 % of the free memory, at
//!    most 8 GiB, in whole 64 MiB) and the multi-stream workload scaled to it, with the
//!    generator's values it draws ([`Draw`]) and the run in which every allocation succeeds
//!    ([`Event`]), in the [plan format](#the-plan-file);
//! 2. `rmm_peer --frag FILE RMM.tsv`: the C++ driver (`benches/peer/rmm_peer.cpp`) checks that
//!    its replay of the draws gives the plan's trace, then measures RMM's
//!    `pool_memory_resource` (over a statistics adaptor over `cuda_memory_resource`, initial 0,
//!    maximum `M`), `arena_memory_resource` (size `M`) and `cuda_async_memory_resource` (RMM's
//!    defaults);
//! 3. `examples/peer frag-run FILE RS.tsv`: the same scenarios with rmm-rs's pool, arena, VMM
//!    pool and driver pool, built and measured by this module's functions, as the benchmark
//!    does;
//! 4. `examples/peer frag-report RS.tsv RMM.tsv`: the three tables, RMM's rows beside rmm-rs's
//!    ([`frag_report`]).
//!
//! The scenarios, as both sides run them (alignment 256 everywhere):
//!
//! - **1957**: a pool of initial 2 MiB and maximum 64 MiB over the CUDA resource (and the VMM
//!   pool of the same sizes), one allocation of 64 MiB on the legacy stream.
//! - **496**: each resource bounded by `M`; allocations of 8 MiB on the legacy stream while
//!   fewer than 75 % of `M` are held, all freed, then two allocations of `M / 5 * 2` rounded
//!   down to 256 B; the bytes reserved then (the statistics adaptor's current bytes, or the
//!   driver pool's `ReservedMemCurrent`).
//! - **multi_stream**: on 4 non-blocking streams made once for all resources, the workload
//!   ([`rmm_mr::testing::fragmentation::run`]; out-of-memory allocations are counted and
//!   skipped), the bytes reserved read after every step, then the largest allocation served on
//!   the first stream (binary search from `M` down, 2 MiB resolution); the time of both.
//!
//! # The plan file
//!
//! ```text
//! rmm-peer-frag 1
//! maximum 8589934592
//! workload 4 4000 5153960755 256 8589934 42949672 687194767 20 8249
//! #        streams steps budget small_lo small_hi large_lo large_hi large_percent seed
//! draws 16000
//! 16294208416658607535 1437 151261813     # raw value, small size, large size
//! ...
//! trace 5214
//! a 0 0 1437                              # step, stream, bytes: an allocation
//! f 31 2 151261813                        # step, stream it is freed on, bytes: a free
//! ...
//! end
//! ```

use std::error::Error;
use std::fmt;
use std::io::{self, BufRead, Write};
use std::time::Instant;

use rmm_mr::testing::fragmentation::{
    largest_allocation, run as run_workload, Draw, Event, MultiStream,
};
use rmm_mr::{
    ArenaMemoryResource, ArenaOptions, CudaAsyncMemoryResource, CudaMemoryResource,
    DeviceMemoryResource, MrResult, PoolMemoryResource, PoolOptions, SimulatedMemoryResource,
    StatisticsResourceAdaptor, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::peer::PeerError;
use crate::sizing::{round_down, GIB, MIB};
use crate::table::Table;

type BoxError = Box<dyn Error>;

/// On a GPU, or over simulated memory and streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// CUDA resources.
    Gpu,
    /// The pool and the arena over `SimulatedMemoryResource`, the simulated VMM pool.
    Simulated,
}

/// rmm-rs's resources, in table order.
pub const NAMES: [&str; 4] = ["pool", "arena", "vmm_pool", "cuda_async"];

impl Mode {
    /// The resources measured, in table order.
    #[must_use]
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Mode::Gpu => &NAMES,
            Mode::Simulated => &NAMES[..3],
        }
    }

    /// Waits for `stream` (nothing to wait for over simulated streams).
    ///
    /// # Errors
    /// The synchronization's.
    pub fn synchronize(self, stream: CudaStreamView<'_>) -> MrResult<()> {
        if self == Mode::Gpu {
            stream.synchronize()?;
        }
        Ok(())
    }
}

/// The maximum `M` of the scenarios for a device with `free` bytes free: 40 % of them, at most
/// 8 GiB, in whole 64 MiB.
#[must_use]
pub fn maximum_for(free: usize) -> usize {
    round_down((8 * GIB).min(free / 10 * 4), 64 * MIB)
}

/// A resource under test, with how to read the bytes it holds from the device now.
pub struct Subject {
    /// Its name in the tables.
    pub name: &'static str,
    /// The resource.
    pub mr: Box<dyn DeviceMemoryResource>,
    /// The bytes it holds from the device now.
    pub reserved: Box<dyn Fn() -> usize>,
    /// The VMM pool, for its growth statistics.
    pub vmm: Option<VmmPoolMemoryResource>,
}

/// The resource `name` over simulated memory of `max` bytes (the pool and the arena; the
/// reserved bytes are the simulated memory's bytes in use) or a simulated VMM pool.
///
/// # Errors
/// The resource's construction.
pub fn simulated_subject(name: &'static str, max: usize) -> MrResult<Subject> {
    let memory = SimulatedMemoryResource::new(max)?;
    let probe = memory.clone();
    let held = Box::new(move || probe.used()) as Box<dyn Fn() -> usize>;
    Ok(match name {
        "pool" => Subject {
            name,
            mr: Box::new(PoolMemoryResource::with_options(
                memory,
                PoolOptions::new(0).maximum_pool_size(max),
            )?),
            reserved: held,
            vmm: None,
        },
        "arena" => Subject {
            name,
            mr: Box::new(ArenaMemoryResource::with_options(
                memory,
                ArenaOptions::new().arena_size(max),
            )?),
            reserved: held,
            vmm: None,
        },
        _ => {
            let vmm = VmmPoolMemoryResource::simulated(VmmPoolOptions::new(max))?;
            let probe = vmm.clone();
            Subject {
                name,
                mr: Box::new(vmm.clone()),
                reserved: Box::new(move || probe.pool_size()),
                vmm: Some(vmm),
            }
        }
    })
}

/// The resource `name` for `mode`, bounded by `max` where it can be.
///
/// # Errors
/// The resource's construction.
pub fn subject_for(mode: Mode, name: &'static str, max: usize) -> MrResult<Subject> {
    match mode {
        Mode::Gpu => subject(name, max),
        Mode::Simulated => simulated_subject(name, max),
    }
}

/// The resource `name` (one of [`NAMES`]), bounded by `max` where it can be: the pool (initial
/// 0, maximum `max`) and the arena (size `max`) over a statistics adaptor over the CUDA
/// resource, the VMM pool of maximum `max`, the driver's pool (no bound). One at a time: the
/// arena takes its whole size up front.
///
/// # Errors
/// The resource's construction.
pub fn subject(name: &'static str, max: usize) -> MrResult<Subject> {
    let held = |s: StatisticsResourceAdaptor<CudaMemoryResource>| {
        Box::new(move || usize::try_from(s.bytes_counter().value).unwrap_or(0))
            as Box<dyn Fn() -> usize>
    };
    let stats = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    Ok(match name {
        "pool" => Subject {
            name,
            mr: Box::new(PoolMemoryResource::with_options(
                stats.clone(),
                PoolOptions::new(0).maximum_pool_size(max),
            )?),
            reserved: held(stats),
            vmm: None,
        },
        "arena" => Subject {
            name,
            mr: Box::new(ArenaMemoryResource::with_options(
                stats.clone(),
                ArenaOptions::new().arena_size(max),
            )?),
            reserved: held(stats),
            vmm: None,
        },
        "vmm_pool" => {
            let vmm = VmmPoolMemoryResource::new(max)?;
            let probe = vmm.clone();
            Subject {
                name,
                mr: Box::new(vmm.clone()),
                reserved: Box::new(move || probe.pool_size()),
                vmm: Some(vmm),
            }
        }
        _ => {
            let driver = CudaAsyncMemoryResource::new()?;
            let probe = driver.clone();
            Subject {
                name,
                mr: Box::new(driver),
                reserved: Box::new(move || {
                    probe
                        .statistics()
                        .map_or(0, |s| usize::try_from(s.reserved_current).unwrap_or(0))
                }),
                vmm: None,
            }
        }
    })
}

/// A scenario of the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// RMM issue 1957.
    Issue1957,
    /// RMM issue 496, scaled.
    Issue496,
    /// The multi-stream workload.
    MultiStream,
}

impl Scenario {
    /// Its name in a results file.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Issue1957 => "1957",
            Scenario::Issue496 => "496",
            Scenario::MultiStream => "multi_stream",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Scenario::Issue1957,
            Scenario::Issue496,
            Scenario::MultiStream,
        ]
        .into_iter()
        .find(|v| v.name() == s)
    }
}

/// One resource's figures in one scenario, as both sides write them.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `rmm-rs` or `rmm`.
    pub side: String,
    /// The scenario.
    pub scenario: Scenario,
    /// The resource's name (`pool`, `arena`, `vmm_pool`, `cuda_async`).
    pub resource: String,
    /// 1957 and 496: whether the (first) large allocation was served.
    pub first: Option<bool>,
    /// 496: whether the second was.
    pub second: Option<bool>,
    /// 496: bytes reserved with both held.
    pub reserved: Option<u64>,
    /// Multi-stream: the most bytes live at once.
    pub peak_live: Option<u64>,
    /// Multi-stream: the most bytes reserved at once.
    pub peak_reserved: Option<u64>,
    /// Multi-stream: the largest allocation served afterwards.
    pub largest: Option<u64>,
    /// Multi-stream: the bytes free afterwards (`M`, nothing live).
    pub free: Option<u64>,
    /// Multi-stream: allocations refused (out of memory).
    pub failed: Option<u64>,
    /// Multi-stream: seconds of the workload and the search.
    pub seconds: Option<f64>,
    /// `ok`, or `error: ...`.
    pub status: String,
}

/// The header line of a results file.
pub const FRAG_RESULTS_HEADER: &str = "side\tscenario\tresource\tfirst\tsecond\treserved\t\
                                       peak_live\tpeak_reserved\tlargest\tfree\tfailed\t\
                                       seconds\tstatus";

fn dash<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_owned(), |v| v.to_string())
}

fn served_word(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "served",
        Some(false) => "oom",
        None => "-",
    }
}

impl Row {
    /// An empty row of rmm-rs's side (`ok`, no figures).
    #[must_use]
    pub fn new(scenario: Scenario, resource: &str) -> Self {
        Self {
            side: "rmm-rs".into(),
            scenario,
            resource: resource.into(),
            first: None,
            second: None,
            reserved: None,
            peak_live: None,
            peak_reserved: None,
            largest: None,
            free: None,
            failed: None,
            seconds: None,
            status: "ok".into(),
        }
    }

    /// Whether it was measured.
    #[must_use]
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }

    /// The row as one line of a results file (no newline).
    #[must_use]
    pub fn to_line(&self) -> String {
        let status: String = self
            .status
            .chars()
            .map(|c| {
                if matches!(c, '\t' | '\n' | '\r') {
                    ' '
                } else {
                    c
                }
            })
            .collect();
        [
            self.side.clone(),
            self.scenario.name().to_owned(),
            self.resource.clone(),
            served_word(self.first).to_owned(),
            served_word(self.second).to_owned(),
            dash(self.reserved),
            dash(self.peak_live),
            dash(self.peak_reserved),
            dash(self.largest),
            dash(self.free),
            dash(self.failed),
            self.seconds.map_or("-".to_owned(), |v| format!("{v:.3}")),
            status,
        ]
        .join("\t")
    }
}

fn err(line: usize, message: impl Into<String>) -> PeerError {
    PeerError {
        line,
        message: message.into(),
    }
}

fn parse<T: std::str::FromStr>(line: usize, v: Option<&str>, what: &str) -> Result<T, PeerError> {
    let v = v.ok_or_else(|| err(line, format!("missing {what}")))?;
    v.parse()
        .map_err(|_| err(line, format!("bad {what}: `{v}`")))
}

/// A results file: its `#` lines (device, versions) and its rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FragResults {
    /// The `#` lines without the `#`, trimmed.
    pub notes: Vec<String>,
    /// The rows in file order.
    pub rows: Vec<Row>,
}

/// Reads a results file (header line optional, `#` lines kept as notes).
///
/// # Errors
/// A line that is not a row of 13 tab-separated fields with the figures parsing.
pub fn read_frag_results(text: &str) -> Result<FragResults, PeerError> {
    let mut out = FragResults::default();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line == FRAG_RESULTS_HEADER {
            continue;
        }
        if let Some(note) = line.strip_prefix('#') {
            out.notes.push(note.trim().to_owned());
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 13 {
            return Err(err(
                n,
                format!("expected 13 tab-separated fields, found {}", f.len()),
            ));
        }
        let served = |v: &str, what: &str| match v {
            "served" => Ok(Some(true)),
            "oom" => Ok(Some(false)),
            "-" => Ok(None),
            _ => Err(err(n, format!("bad {what}: `{v}`"))),
        };
        fn opt<T: std::str::FromStr>(
            n: usize,
            v: &str,
            what: &str,
        ) -> Result<Option<T>, PeerError> {
            (v != "-").then(|| parse(n, Some(v), what)).transpose()
        }
        out.rows.push(Row {
            side: f[0].to_owned(),
            scenario: Scenario::parse(f[1])
                .ok_or_else(|| err(n, format!("unknown scenario `{}`", f[1])))?,
            resource: f[2].to_owned(),
            first: served(f[3], "first")?,
            second: served(f[4], "second")?,
            reserved: opt(n, f[5], "reserved")?,
            peak_live: opt(n, f[6], "peak_live")?,
            peak_reserved: opt(n, f[7], "peak_reserved")?,
            largest: opt(n, f[8], "largest")?,
            free: opt(n, f[9], "free")?,
            failed: opt(n, f[10], "failed")?,
            seconds: opt(n, f[11], "seconds")?,
            status: f[12].to_owned(),
        });
    }
    Ok(out)
}

/// The plan both sides run: the maximum, the workload, its draws and its trace.
#[derive(Debug, Clone, PartialEq)]
pub struct FragPlan {
    /// `M`, bytes.
    pub maximum: usize,
    /// The multi-stream workload (scaled to `M`).
    pub workload: MultiStream,
    /// The generator's values the workload draws ([`MultiStream::draws`], `max_draws` of them).
    pub draws: Vec<Draw>,
    /// The run in which every allocation succeeds ([`MultiStream::trace`]).
    pub trace: Vec<Event>,
}

/// The first line of a plan file.
pub const FRAG_PLAN_MAGIC: &str = "rmm-peer-frag 1";

impl FragPlan {
    /// The plan for a maximum of `maximum` bytes; `quick`: 1,000 steps (as the benchmark's
    /// `--quick`).
    #[must_use]
    pub fn new(maximum: usize, quick: bool) -> Self {
        let mut workload = MultiStream::scaled(maximum);
        if quick {
            workload.steps = 1000;
        }
        Self {
            maximum,
            draws: workload.draws(workload.max_draws()),
            trace: workload.trace(),
            workload,
        }
    }

    /// Whether the draws and the trace are the workload's own (a plan read back from a file).
    ///
    /// # Errors
    /// Which of them differs.
    pub fn verify(&self) -> Result<(), String> {
        let w = &self.workload;
        if w.streams < 2 {
            return Err("the workload needs at least 2 streams".into());
        }
        if self.draws != w.draws(w.max_draws()) {
            return Err("the draws are not the workload's generator's".into());
        }
        if self.trace != w.trace() {
            return Err("the trace is not the workload's".into());
        }
        Ok(())
    }
}

/// Writes `plan` in the plan format.
///
/// # Errors
/// The writer's.
pub fn write_frag_plan(plan: &FragPlan, w: &mut impl Write) -> io::Result<()> {
    let m = &plan.workload;
    writeln!(w, "{FRAG_PLAN_MAGIC}")?;
    writeln!(w, "maximum {}", plan.maximum)?;
    writeln!(
        w,
        "# streams steps budget small_lo small_hi large_lo large_hi large_percent seed"
    )?;
    writeln!(
        w,
        "workload {} {} {} {} {} {} {} {} {}",
        m.streams,
        m.steps,
        m.budget,
        m.small.0,
        m.small.1,
        m.large.0,
        m.large.1,
        m.large_percent,
        m.seed
    )?;
    writeln!(w, "draws {}", plan.draws.len())?;
    for d in &plan.draws {
        writeln!(w, "{} {} {}", d.raw, d.small, d.large)?;
    }
    writeln!(w, "trace {}", plan.trace.len())?;
    for e in &plan.trace {
        match *e {
            Event::Alloc {
                step,
                stream,
                bytes,
            } => writeln!(w, "a {step} {stream} {bytes}")?,
            Event::Free {
                step,
                stream,
                bytes,
            } => writeln!(w, "f {step} {stream} {bytes}")?,
        }
    }
    writeln!(w, "end")
}

/// Reads a plan file (`#` lines and blank lines ignored).
///
/// # Errors
/// A malformed or incomplete plan, with its line.
pub fn read_frag_plan(r: impl BufRead) -> Result<FragPlan, PeerError> {
    let mut lines = r
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| {
            l.as_ref().map_or(true, |l| {
                !l.trim().is_empty() && !l.trim_start().starts_with('#')
            })
        });
    let mut next = |what: &str| -> Result<(usize, Vec<String>), PeerError> {
        match lines.next() {
            Some((n, Ok(l))) => Ok((n, l.split_whitespace().map(str::to_owned).collect())),
            Some((n, Err(e))) => Err(err(n, format!("cannot read: {e}"))),
            None => Err(err(0, format!("expected {what}"))),
        }
    };
    let keyed = |(n, f): (usize, Vec<String>), key: &str, count: usize| {
        if f.first().map(String::as_str) != Some(key) || f.len() != count + 1 {
            return Err(err(n, format!("expected `{key}` and {count} number(s)")));
        }
        f[1..]
            .iter()
            .map(|v| parse::<u64>(n, Some(v), key))
            .collect::<Result<Vec<u64>, _>>()
    };
    let (n, magic) = next(FRAG_PLAN_MAGIC)?;
    if magic.join(" ") != FRAG_PLAN_MAGIC {
        return Err(err(n, format!("expected `{FRAG_PLAN_MAGIC}`")));
    }
    let us = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let maximum = us(keyed(next("maximum")?, "maximum", 1)?[0]);
    let w = keyed(next("workload")?, "workload", 9)?;
    let workload = MultiStream {
        streams: us(w[0]),
        steps: us(w[1]),
        budget: us(w[2]),
        small: (us(w[3]), us(w[4])),
        large: (us(w[5]), us(w[6])),
        large_percent: us(w[7]),
        seed: w[8],
    };
    let count = keyed(next("draws")?, "draws", 1)?[0];
    let mut draws = Vec::new();
    for _ in 0..count {
        let (n, f) = next("a draw")?;
        if f.len() != 3 {
            return Err(err(n, "expected `RAW SMALL LARGE`"));
        }
        draws.push(Draw {
            raw: parse(n, Some(&f[0]), "raw value")?,
            small: parse(n, Some(&f[1]), "small size")?,
            large: parse(n, Some(&f[2]), "large size")?,
        });
    }
    let count = keyed(next("trace")?, "trace", 1)?[0];
    let mut trace = Vec::new();
    for _ in 0..count {
        let (n, f) = next("an event")?;
        if f.len() != 4 {
            return Err(err(n, "expected `a|f STEP STREAM BYTES`"));
        }
        let (step, stream, bytes) = (
            parse(n, Some(&f[1]), "step")?,
            parse(n, Some(&f[2]), "stream")?,
            parse(n, Some(&f[3]), "bytes")?,
        );
        trace.push(match f[0].as_str() {
            "a" => Event::Alloc {
                step,
                stream,
                bytes,
            },
            "f" => Event::Free {
                step,
                stream,
                bytes,
            },
            _ => return Err(err(n, "expected `a` or `f`")),
        });
    }
    let (n, end) = next("end")?;
    if end != ["end"] {
        return Err(err(n, "expected `end`"));
    }
    if let Some((n, _)) = lines.next() {
        return Err(err(n, "unexpected line after `end`"));
    }
    Ok(FragPlan {
        maximum,
        workload,
        draws,
        trace,
    })
}

fn legacy() -> CudaStreamView<'static> {
    CudaStreamView::legacy()
}

/// `Some(p)` when served, `None` on out-of-memory, other errors passed on.
fn outcome(r: MrResult<DevicePtr>) -> MrResult<Option<DevicePtr>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_out_of_memory() => Ok(None),
        Err(e) => Err(e),
    }
}

fn free(mr: &dyn DeviceMemoryResource, p: DevicePtr, bytes: usize) -> MrResult<()> {
    // SAFETY: every caller frees what it allocated from `mr` on the legacy stream with this
    // size; no work used it.
    unsafe { mr.deallocate(legacy(), p, bytes, 256) }
}

/// The row of `resource` in `scenario` from what measuring it gave.
fn row_of(scenario: Scenario, resource: &str, r: Result<Row, BoxError>) -> Row {
    r.unwrap_or_else(|e| Row {
        status: format!("error: {e}"),
        ..Row::new(scenario, resource)
    })
}

/// RMM issue 1957 on rmm-rs's pool and VMM pool: initial 2 MiB, maximum 64 MiB, one
/// allocation of 64 MiB.
#[must_use]
pub fn issue_1957(mode: Mode) -> Vec<Row> {
    let pool_options = PoolOptions::new(2 * MIB).maximum_pool_size(64 * MIB);
    let options = VmmPoolOptions::new(64 * MIB).initial_pool_size(2 * MIB);
    ["pool", "vmm_pool"]
        .into_iter()
        .map(|name| {
            let measured = (|| -> Result<Row, BoxError> {
                let mr: Box<dyn DeviceMemoryResource> = match (name, mode) {
                    ("pool", Mode::Gpu) => Box::new(PoolMemoryResource::with_options(
                        CudaMemoryResource::new(),
                        pool_options,
                    )?),
                    ("pool", Mode::Simulated) => Box::new(PoolMemoryResource::with_options(
                        SimulatedMemoryResource::new(GIB)?,
                        pool_options,
                    )?),
                    (_, Mode::Gpu) => {
                        Box::new(VmmPoolMemoryResource::with_options(options.clone())?)
                    }
                    (_, Mode::Simulated) => {
                        Box::new(VmmPoolMemoryResource::simulated(options.clone())?)
                    }
                };
                let p = outcome(mr.allocate(legacy(), 64 * MIB, 256))?;
                if let Some(p) = p {
                    free(&*mr, p, 64 * MIB)?;
                }
                mode.synchronize(legacy())?;
                Ok(Row {
                    first: Some(p.is_some()),
                    ..Row::new(Scenario::Issue1957, name)
                })
            })();
            row_of(Scenario::Issue1957, name, measured)
        })
        .collect()
}

/// The size of each of the two large allocations of issue 496 for a maximum of `max`.
#[must_use]
pub fn issue_496_large(max: usize) -> usize {
    max / 5 * 2 / 256 * 256
}

/// RMM issue 496, scaled, on `mode`'s resources bounded by `max`: 8 MiB allocations while
/// fewer than 75 % of `max` are held, all freed, then two allocations of
/// [`issue_496_large`]`(max)`.
#[must_use]
pub fn issue_496(mode: Mode, max: usize) -> Vec<Row> {
    let large = issue_496_large(max);
    mode.names()
        .iter()
        .map(|&name| {
            let measured = (|| -> Result<Row, BoxError> {
                let s = subject_for(mode, name, max)?;
                let mr = &*s.mr;
                let mut small = Vec::new();
                while small.len() * 8 * MIB < max / 4 * 3 {
                    small.push(mr.allocate(legacy(), 8 * MIB, 256)?);
                }
                for p in small {
                    free(mr, p, 8 * MIB)?;
                }
                let a = outcome(mr.allocate(legacy(), large, 256))?;
                let b = outcome(mr.allocate(legacy(), large, 256))?;
                let reserved = (s.reserved)();
                for p in [a, b].into_iter().flatten() {
                    free(mr, p, large)?;
                }
                mode.synchronize(legacy())?;
                Ok(Row {
                    first: Some(a.is_some()),
                    second: Some(b.is_some()),
                    reserved: Some(reserved as u64),
                    ..Row::new(Scenario::Issue496, name)
                })
            })();
            row_of(Scenario::Issue496, name, measured)
        })
        .collect()
}

/// The multi-stream workload on `mode`'s resources bounded by `max`, on `views` (at least
/// `workload.streams`), then the largest allocation served on the first (2 MiB resolution).
#[must_use]
pub fn multi_stream(
    mode: Mode,
    max: usize,
    workload: &MultiStream,
    views: &[CudaStreamView<'_>],
) -> Vec<Row> {
    mode.names()
        .iter()
        .map(|&name| {
            let measured = (|| -> Result<Row, BoxError> {
                let s = subject_for(mode, name, max)?;
                let start = Instant::now();
                let out = run_workload(&*s.mr, views, workload, &*s.reserved)?;
                let largest = largest_allocation(&*s.mr, views[0], max, 2 * MIB)?;
                let seconds = start.elapsed().as_secs_f64();
                for &v in views {
                    mode.synchronize(v)?;
                }
                Ok(Row {
                    peak_live: Some(out.peak_live as u64),
                    peak_reserved: Some(out.peak_reserved as u64),
                    largest: Some(largest as u64),
                    free: Some(max as u64),
                    failed: Some(out.failed as u64),
                    seconds: Some(seconds),
                    ..Row::new(Scenario::MultiStream, name)
                })
            })();
            row_of(Scenario::MultiStream, name, measured)
        })
        .collect()
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".to_owned(), |b| (b / MIB as u64).to_string())
}

fn fraction(a: Option<u64>, b: Option<u64>, digits: usize) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.digits$}", a as f64 / b.max(1) as f64),
        _ => "-".to_owned(),
    }
}

fn served_cell(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "served",
        Some(false) => "out of memory",
        None => "-",
    }
}

/// A table of `rows`, one per row: the side (`with_side`) and the resource, then the
/// columns `figures` names, `text` of them text (left-aligned) and the rest numbers; a row that
/// failed has its status in place of its figures.
fn figures_table(
    rows: &[&Row],
    with_side: bool,
    text: usize,
    figures: &[&str],
    cells: impl Fn(&Row) -> Vec<String>,
) -> Table {
    let mut headers: Vec<&str> = Vec::new();
    if with_side {
        headers.push("side");
    }
    headers.push("resource");
    headers.extend(figures);
    let mut t = Table::new(&headers, usize::from(with_side) + 1 + text);
    for r in rows {
        let mut row = Vec::new();
        if with_side {
            row.push(r.side.clone());
        }
        row.push(r.resource.clone());
        if r.ok() {
            row.extend(cells(r));
        } else {
            row.push(r.status.clone());
        }
        t.row(row);
    }
    t
}

/// The table of issue 1957 (`with_side`: a first column naming the side).
#[must_use]
pub fn table_1957(rows: &[&Row], with_side: bool) -> Table {
    figures_table(rows, with_side, 1, &["64 MiB"], |r| {
        vec![served_cell(r.first).to_owned()]
    })
}

/// The table of issue 496 (`with_side`: a first column naming the side).
#[must_use]
pub fn table_496(rows: &[&Row], with_side: bool) -> Table {
    figures_table(
        rows,
        with_side,
        2,
        &["first", "second", "reserved (MiB)"],
        |r| {
            vec![
                served_cell(r.first).to_owned(),
                served_cell(r.second).to_owned(),
                mib(r.reserved),
            ]
        },
    )
}

/// The table of the multi-stream workload (`with_side`: a first column naming the side).
#[must_use]
pub fn table_multi_stream(rows: &[&Row], with_side: bool) -> Table {
    figures_table(
        rows,
        with_side,
        0,
        &[
            "peak live (MiB)",
            "peak reserved (MiB)",
            "reserved / live",
            "free after (MiB)",
            "largest after (MiB)",
            "largest / free",
            "failed allocations",
            "seconds",
        ],
        |r| {
            vec![
                mib(r.peak_live),
                mib(r.peak_reserved),
                fraction(r.peak_reserved, r.peak_live, 2),
                mib(r.free),
                mib(r.largest),
                fraction(r.largest, r.free, 3),
                dash(r.failed),
                r.seconds.map_or("-".to_owned(), |s| format!("{s:.2}")),
            ]
        },
    )
}

/// The comparison: one table per scenario, each resource's rmm-rs row then RMM's.
#[derive(Debug, Clone)]
pub struct FragReport {
    /// Issue 1957.
    pub issue_1957: Table,
    /// Issue 496.
    pub issue_496: Table,
    /// The multi-stream workload.
    pub multi_stream: Table,
    /// Rows of each side: rmm-rs, RMM.
    pub rows: (usize, usize),
    /// Rows that failed (an error on either side).
    pub failed: usize,
}

/// Where a resource's rows go: [`NAMES`] order, others after.
fn order(resource: &str) -> usize {
    NAMES
        .iter()
        .position(|&n| n == resource)
        .unwrap_or(NAMES.len())
}

/// The tables of both sides' rows (`ours`: rmm-rs, `theirs`: RMM), side by side.
#[must_use]
pub fn frag_report(ours: &[Row], theirs: &[Row]) -> FragReport {
    let mut all: Vec<(usize, &Row)> = ours
        .iter()
        .map(|r| (0, r))
        .chain(theirs.iter().map(|r| (1, r)))
        .collect();
    // Stable: within a resource and a side, file order.
    all.sort_by_key(|&(side, r)| (order(&r.resource), r.resource.clone(), side));
    let of = |s: Scenario| -> Vec<&Row> {
        all.iter()
            .filter(|(_, r)| r.scenario == s)
            .map(|&(_, r)| r)
            .collect()
    };
    FragReport {
        issue_1957: table_1957(&of(Scenario::Issue1957), true),
        issue_496: table_496(&of(Scenario::Issue496), true),
        multi_stream: table_multi_stream(&of(Scenario::MultiStream), true),
        rows: (ours.len(), theirs.len()),
        failed: all.iter().filter(|(_, r)| !r.ok()).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_plan() -> FragPlan {
        let mut plan = FragPlan::new(256 * MIB, true);
        plan.workload.steps = 200;
        plan.draws = plan.workload.draws(plan.workload.max_draws());
        plan.trace = plan.workload.trace();
        plan
    }

    fn written(plan: &FragPlan) -> String {
        let mut out = Vec::new();
        write_frag_plan(plan, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_plan_is_the_benchmarks_workload() {
        let m = maximum_for(79 * GIB);
        assert_eq!(m, 8 * GIB);
        assert_eq!(maximum_for(9 * GIB), 3648 * MIB);
        let plan = FragPlan::new(m, false);
        assert_eq!(plan.workload, MultiStream::scaled(m));
        assert_eq!(plan.draws.len(), 16_000);
        assert_eq!(plan.verify(), Ok(()));
        let quick = FragPlan::new(m, true);
        assert_eq!(quick.workload.steps, 1000);
        assert_eq!(quick.draws.len(), 4000);
        assert_eq!(issue_496_large(8 * GIB), 3_435_973_632);
    }

    #[test]
    fn a_plan_reads_back_as_written() {
        let plan = small_plan();
        let text = written(&plan);
        assert!(
            text.starts_with("rmm-peer-frag 1\nmaximum 268435456\n"),
            "{text}"
        );
        let back = read_frag_plan(text.as_bytes()).unwrap();
        assert_eq!(back, plan);
        assert_eq!(back.verify(), Ok(()));
        assert!(text.lines().any(|l| l.starts_with("a 0 0 ")), "{text}");
        assert!(text.lines().any(|l| l.starts_with("f ")), "{text}");
    }

    #[test]
    fn a_bad_plan_is_refused_with_its_line() {
        let text = written(&small_plan());
        let lines: Vec<&str> = text.lines().collect();
        let with = |i: usize, new: &str| {
            let mut l = lines.clone();
            l[i] = new;
            l.join("\n")
        };
        let e = read_frag_plan(with(0, "rmm-peer-plan 1").as_bytes()).unwrap_err();
        assert_eq!(e.line, 1, "{e}");
        let e = read_frag_plan(with(1, "maximum x").as_bytes()).unwrap_err();
        assert!(e.message.contains("bad maximum"), "{e}");
        let e = read_frag_plan(with(5, "1 2").as_bytes()).unwrap_err();
        assert_eq!(e.line, 6, "{e}");
        let e = read_frag_plan(with(lines.len() - 1, "done").as_bytes()).unwrap_err();
        assert!(e.message.contains("`end`"), "{e}");
        let cut = lines[..lines.len() - 3].join("\n");
        let e = read_frag_plan(cut.as_bytes()).unwrap_err();
        assert_eq!(e.line, 0, "{e}");
        let extra = format!("{text}a 1 1 1\n");
        assert!(read_frag_plan(extra.as_bytes()).is_err());
        // A plan that reads but whose draws or trace are not the workload's fails the check.
        let mut bad = small_plan();
        bad.draws[3].small += 1;
        assert!(bad.verify().unwrap_err().contains("draws"));
        let mut bad = small_plan();
        bad.trace.pop();
        assert!(bad.verify().unwrap_err().contains("trace"));
    }

    /// The C++ side (`benches/peer/rmm_peer.cpp`, compiled on the GPU machine only) reads the
    /// plan format and writes the results format of this module.
    #[test]
    fn the_cpp_side_speaks_these_formats() {
        let cpp = include_str!("../peer/rmm_peer.cpp");
        assert!(cpp.contains(&format!("\"{FRAG_PLAN_MAGIC}\"")));
        assert!(cpp.contains(&format!(
            "\"{}\\n\"",
            FRAG_RESULTS_HEADER.replace('\t', "\\t")
        )));
        for key in [
            "\"maximum\"",
            "\"workload\"",
            "\"draws\"",
            "\"trace\"",
            "\"end\"",
        ] {
            assert!(cpp.contains(key), "{key}");
        }
        for name in ["1957", "496", "multi_stream", "served", "oom"] {
            assert!(cpp.contains(&format!("\"{name}\"")), "{name}");
        }
        assert!(
            cpp.contains("char const* const FRAG_KINDS[] = {\"pool\", \"arena\", \"cuda_async\"};")
        );
    }

    fn row(side: &str, scenario: Scenario, resource: &str) -> Row {
        Row {
            side: side.into(),
            ..Row::new(scenario, resource)
        }
    }

    /// A multi-stream row: peak live, peak reserved, largest and free (MiB), failed
    /// allocations and seconds.
    fn multi(side: &str, resource: &str, in_mib: [usize; 4], failed: u64, seconds: f64) -> Row {
        let [live, reserved, largest, free] = in_mib.map(|m| (m * MIB) as u64);
        Row {
            peak_live: Some(live),
            peak_reserved: Some(reserved),
            largest: Some(largest),
            free: Some(free),
            failed: Some(failed),
            seconds: Some(seconds),
            ..row(side, Scenario::MultiStream, resource)
        }
    }

    #[test]
    fn rows_read_back_as_written() {
        let rows = vec![
            Row {
                first: Some(false),
                ..row("rmm", Scenario::Issue1957, "pool")
            },
            Row {
                first: Some(true),
                second: Some(false),
                reserved: Some(8 << 30),
                ..row("rmm-rs", Scenario::Issue496, "arena")
            },
            multi("rmm", "cuda_async", [4915, 7680, 4096, 8192], 3, 1.25),
            Row {
                status: "error: out\tof memory".into(),
                ..row("rmm", Scenario::MultiStream, "arena")
            },
        ];
        let mut text = format!("# side: rmm 26.10\n{FRAG_RESULTS_HEADER}\n");
        for r in &rows {
            text.push_str(&r.to_line());
            text.push('\n');
        }
        let back = read_frag_results(&text).unwrap();
        assert_eq!(back.notes, ["side: rmm 26.10"]);
        let mut expected = rows.clone();
        expected[3].status = "error: out of memory".into();
        assert_eq!(back.rows, expected);
        let e = read_frag_results("rmm\t1957\tpool\n").unwrap_err();
        assert_eq!(e.line, 1);
        let bad = rows[0].to_line().replace("oom", "maybe");
        assert!(read_frag_results(&bad).is_err());
        let bad = rows[0].to_line().replace("1957", "2039");
        assert!(read_frag_results(&bad).is_err());
    }

    #[test]
    fn the_report_puts_rmms_rows_beside_ours() {
        let ours: Vec<Row> = NAMES
            .iter()
            .map(|n| multi("rmm-rs", n, [100, 150, 1024, 1024], 0, 0.5))
            .chain([Row {
                first: Some(true),
                ..row("rmm-rs", Scenario::Issue1957, "pool")
            }])
            .collect();
        let theirs = vec![
            multi("rmm", "pool", [100, 200, 512, 1024], 2, 0.25),
            Row {
                status: "error: boom".into(),
                ..row("rmm", Scenario::MultiStream, "cuda_async")
            },
            Row {
                first: Some(false),
                ..row("rmm", Scenario::Issue1957, "pool")
            },
        ];
        let r = frag_report(&ours, &theirs);
        assert_eq!((r.rows, r.failed), ((5, 3), 1));
        let multi = r.multi_stream.render();
        let lines: Vec<&str> = multi.lines().skip(2).collect();
        assert_eq!(lines.len(), 6, "{multi}");
        assert!(
            lines[0].starts_with("| rmm-rs | pool | 100 | 150 | 1.50 | 1024 | 1024 | 1.000 | 0 |"),
            "{multi}"
        );
        assert!(
            lines[1].starts_with("| rmm | pool | 100 | 200 | 2.00 | 1024 | 512 | 0.500 | 2 |"),
            "{multi}"
        );
        assert!(lines[2].starts_with("| rmm-rs | arena |"), "{multi}");
        assert!(lines[3].starts_with("| rmm-rs | vmm_pool |"), "{multi}");
        assert!(lines[4].starts_with("| rmm-rs | cuda_async |"), "{multi}");
        assert!(
            lines[5].starts_with("| rmm | cuda_async | error: boom |"),
            "{multi}"
        );
        let t1957 = r.issue_1957.render();
        assert!(
            t1957.contains("| rmm-rs | pool | served |\n| rmm | pool | out of memory |"),
            "{t1957}"
        );
        assert!(r.issue_496.is_empty());
    }
}
